"""Element sets of views and indexing ops, computed by recorder.elements, against ids worked
out by hand from sizes, strides and offsets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from overlap_harness.recorder.elements import (
    element_ids,
    index_elements,
    is_view_or_metadata,
    row_elements,
    schema_accesses,
    to_storage_elements,
)

aten = torch.ops.aten


def ids(values) -> list[int]:
    return [int(v) for v in values]


def test_contiguous_slice_names_its_offset_range():
    base = torch.zeros(10)
    assert ids(element_ids(base[3:7])) == [3, 4, 5, 6]


def test_column_slice_of_a_matrix_names_strided_elements():
    base = torch.zeros(4, 5)
    # column 1..2 of each row: row r starts at 5 r
    assert ids(element_ids(base[:, 1:3])) == [1, 2, 6, 7, 11, 12, 16, 17]


def test_transposed_view_names_the_same_elements_in_its_own_order():
    base = torch.zeros(2, 3)
    assert sorted(ids(element_ids(base.t()))) == [0, 1, 2, 3, 4, 5]
    assert ids(element_ids(base.t())) == [0, 3, 1, 4, 2, 5]


def test_expanded_view_names_each_element_once():
    base = torch.zeros(3)
    assert ids(element_ids(base[1:2].expand(4))) == [1]


def test_overlapping_as_strided_views_share_exactly_their_overlap():
    base = torch.zeros(16)
    first = base.as_strided((3, 2), (4, 1), 1)  # 1,2  5,6  9,10
    second = base.as_strided((2, 2), (4, 1), 6)  # 6,7  10,11
    common = np.intersect1d(element_ids(first), element_ids(second))
    assert ids(common) == [6, 10]


def test_empty_view_names_nothing():
    assert element_ids(torch.zeros(4)[2:2]).size == 0


def test_view_through_a_wider_dtype_covers_every_storage_element_it_spans():
    # int64 element 1 of a float32 storage spans float32 elements 2 and 3
    assert ids(to_storage_elements(np.array([1]), 8, 4)) == [2, 3]
    assert ids(to_storage_elements(np.array([5]), 4, 8)) == [2]


def test_index_reads_only_the_named_rows():
    buf = torch.zeros(6, 2)
    picked, read, write = index_elements(aten.index.Tensor, (buf, [torch.tensor([4, 1])]), {})
    assert (ids(picked), read, write) == ([2, 3, 8, 9], True, False)


def test_index_put_writes_only_the_named_rows_of_a_view():
    buf = torch.zeros(8, 2)
    view = buf[2:]  # offset 4
    args = (view, [torch.tensor([0, 3])], torch.ones(2, 2))
    picked, read, write = index_elements(aten.index_put_.default, args, {})
    assert (ids(picked), read, write) == ([4, 5, 10, 11], False, True)


def test_index_put_with_accumulate_reads_what_it_writes():
    buf = torch.zeros(4)
    args = (buf, [torch.tensor([2])], torch.ones(1), True)
    picked, read, write = index_elements(aten.index_put_.default, args, {})
    assert (ids(picked), read, write) == ([2], True, True)


def test_gather_and_scatter_touch_the_indexed_elements():
    buf = torch.zeros(3, 4)
    index = torch.tensor([[3], [0], [2]])
    picked, _, _ = index_elements(aten.gather.default, (buf, 1, index), {})
    assert ids(picked) == [3, 4, 10]
    picked, read, write = index_elements(aten.scatter_.src, (buf, 1, index, torch.ones(3, 1)), {})
    assert (ids(picked), read, write) == ([3, 4, 10], False, True)


def test_index_select_and_index_copy_touch_whole_rows():
    buf = torch.zeros(4, 3)
    index = torch.tensor([3, 1])
    picked, _, _ = index_elements(aten.index_select.default, (buf, 0, index), {})
    assert ids(picked) == [3, 4, 5, 9, 10, 11]
    args = (buf, 0, index, torch.ones(2, 3))
    picked, _, write = index_elements(aten.index_copy_.default, args, {})
    assert (ids(picked), write) == ([3, 4, 5, 9, 10, 11], True)


def test_masked_fill_writes_where_the_mask_is_set():
    buf = torch.zeros(5)
    mask = torch.tensor([True, False, False, True, False])
    picked, _, write = index_elements(aten.masked_fill_.Scalar, (buf, mask, 1.0), {})
    assert (ids(picked), write) == ([0, 3], True)


def test_non_indexing_op_has_no_picked_elements():
    assert index_elements(aten.add.Tensor, (torch.zeros(2), torch.zeros(2)), {}) is None


def test_row_elements_of_a_declared_access():
    buf = torch.zeros(5, 2)
    assert ids(row_elements(buf, torch.tensor([4, 0]))) == [0, 1, 8, 9]


def test_schema_marks_the_written_argument():
    dst, src = torch.zeros(2), torch.ones(2)
    got = [(t is dst, write) for t, write in schema_accesses(aten.copy_.default, (dst, src), {})]
    assert got == [(True, True), (False, False)]


@pytest.mark.parametrize(("op", "expected"), [
    (aten.slice.Tensor, True), (aten.view.default, True), (aten.t.default, True),
    (aten.add_.Tensor, False), (aten.add.Tensor, False), (aten._local_scalar_dense.default, False),
])
def test_views_touch_no_memory(op, expected):
    assert is_view_or_metadata(op) is expected
