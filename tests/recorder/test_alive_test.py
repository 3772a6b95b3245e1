"""The recorder's check that a watched storage still lives (its block goes back to the pool
when it does not): true while any tensor holds the storage, false once the last is gone."""

from __future__ import annotations

import gc

import torch

from overlap_harness.recorder.dispatch import alive_test


def test_a_storage_is_alive_while_a_view_holds_it_and_dead_after() -> None:
    base = torch.zeros(8)
    alive = alive_test(base.untyped_storage())
    view = base[2:4]
    del base
    gc.collect()
    assert alive()  # the view still holds the storage
    del view
    gc.collect()
    assert not alive()


def test_the_check_does_not_keep_its_storage() -> None:
    tensor = torch.ones(4)
    checks = [alive_test(tensor.untyped_storage()) for _ in range(3)]
    assert all(check() for check in checks)
    del tensor
    assert not any(check() for check in checks)
