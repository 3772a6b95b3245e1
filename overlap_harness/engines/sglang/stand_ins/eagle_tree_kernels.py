"""SGLang's Triton kernels of EAGLE tree drafting (topk > 1), declared to the recorder: the
tree build, the verify slots gathered on the plan stream, and the packing of the accepted
path's slots before its KV moves to the front. Same conventions as
:mod:`.stand_ins.eagle_kernels`."""

from __future__ import annotations

from typing import Any

import torch

import overlap_harness.recorder as recorder
from overlap_harness.engines.sglang.stand_ins.eagle_models import device_tensor, draft_windows, peek
from overlap_harness.recorder.kernels import DeclaredAccess, reads, writes

# -- kernels.ops.speculative.spec_tree.build_tree_kernel_efficient_func (topk > 1) -------


def _tree_parents(parent_list: list[int], selected: list[int], topk: int) -> list[int]:
    """Each verified node's parent node (node 0 is the root, the bonus token; node ``i``
    is the ``i-1``-th selected draft): the root when its draft was drawn from the root's
    candidates, else the node whose selected draft is the one it was drawn from."""
    parents = [-1]
    for index in selected:
        drawn_from = index // topk
        if drawn_from == 0:
            parents.append(0)
            continue
        origin = parent_list[drawn_from]
        parents.append(next((k + 1 for k, other in enumerate(selected) if other == origin),
                            0))
    return parents


def _tree_rows(seq_lens: list[int], width: int, tree_mask_mode: Any) -> list[list[int]]:
    """Where the mask row of each lane's node starts, ``width`` cells each, by the mask's
    layout (the mode by its name: the enum lives in spec_tree, or in eagle_utils (0.5.17)).
    FULL_MASK: rows of ``seq_len + width`` cells after the lanes before it, the tree cells
    after the ``seq_len`` prefix columns; QLEN_ONLY: a ``width x width`` block per lane,
    tree cells only (SGLang's Triton tree builder, kernels.ops.speculative.spec_tree, writes
    both layouts; releases before 0.5.22 verify topk-1 chains in QLEN_ONLY when the mask is
    not read)."""
    mode = getattr(tree_mask_mode, "name", None)
    rows, offset = [], 0
    for lane, length in enumerate(seq_lens):
        if mode == "FULL_MASK":
            rows.append([offset + node * (length + width) + length for node in range(width)])
            offset += width * (length + width)
        elif mode == "QLEN_ONLY":
            rows.append([(lane * width + node) * width for node in range(width)])
        else:
            raise NotImplementedError(f"build_tree: mask mode {tree_mask_mode!r} is not "
                                      "planned")
    return rows


def _build_tree(parent_list: torch.Tensor, top_scores_index: torch.Tensor,
                seq_lens: torch.Tensor, tree_mask: torch.Tensor, positions: torch.Tensor,
                retrieve_index: torch.Tensor, retrieve_next_token: torch.Tensor,
                retrieve_next_sibling: torch.Tensor, topk: int, spec_steps: int,
                num_verify_tokens: int, tree_mask_mode: Any) -> None:
    """The verify tree of each lane: node positions (``seq_len + depth``), retrieve index,
    first child and next sibling (children linked last first), and each node's mask row's
    tree cells (a node sees the root and its ancestors; :func:`_tree_rows`)."""
    width = num_verify_tokens
    lengths = peek(seq_lens)
    index_rows, next_rows, sibling_rows, position_rows = [], [], [], []
    mask = peek(tree_mask)
    for lane, (parents_of, selected, length, starts) in enumerate(zip(
            peek(parent_list), peek(top_scores_index), lengths,
            _tree_rows(lengths, width, tree_mask_mode), strict=True)):
        parents = _tree_parents(parents_of, selected[:width - 1], topk)
        first_child, sibling = [-1] * width, [-1] * width
        for node in range(width - 1, 0, -1):
            sibling[node] = first_child[parents[node]]
            first_child[parents[node]] = node
        depth = [0] * width
        for node in range(1, width):
            depth[node] = depth[parents[node]] + 1
        for node, row in enumerate(starts):
            seen = {0}
            walk = node
            while walk > 0:
                seen.add(walk)
                walk = parents[walk]
            for column in range(width):
                mask[row + column] = column in seen
        index_rows.append([lane * width + node for node in range(width)])
        next_rows.append(first_child)
        sibling_rows.append(sibling)
        position_rows.append([length + d for d in depth])
    tree_mask.copy_(device_tensor(mask, tree_mask))
    retrieve_index.copy_(device_tensor(index_rows, retrieve_index))
    retrieve_next_token.copy_(device_tensor(next_rows, retrieve_next_token))
    retrieve_next_sibling.copy_(device_tensor(sibling_rows, retrieve_next_sibling))
    positions.copy_(device_tensor(position_rows, positions).view(-1))


def _build_tree_accesses(out: Any, parent_list: torch.Tensor, top_scores_index: torch.Tensor,
                         seq_lens: torch.Tensor, tree_mask: torch.Tensor,
                         positions: torch.Tensor, retrieve_index: torch.Tensor,
                         retrieve_next_token: torch.Tensor,
                         retrieve_next_sibling: torch.Tensor, topk: int, spec_steps: int,
                         num_verify_tokens: int, tree_mask_mode: Any) -> list[DeclaredAccess]:
    acc = reads(parent_list) + reads(top_scores_index) + reads(seq_lens)
    acc += writes(positions) + writes(retrieve_index) + writes(retrieve_next_token)
    acc += writes(retrieve_next_sibling)
    width = num_verify_tokens
    lengths = peek(seq_lens)
    for starts in _tree_rows(lengths, width, tree_mask_mode):
        for row in starts:
            acc += writes(tree_mask[row:row + width])
    return acc


# -- kernels.ops.speculative.cache_locs.assign_extend_cache_locs_uniform_func -------------


def _extend_cache_locs(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                       start_offset: torch.Tensor, batch_size: int, draft_token_num: int,
                       device: Any, **options: Any) -> torch.Tensor:
    """The verify window of each request: ``req_to_token[row, start:start + width]``."""
    if any(value is not None for key, value in options.items() if key != "page_size"):
        raise NotImplementedError(f"assign_extend_cache_locs_uniform: {sorted(options)}")
    rows = req_pool_indices[:batch_size].to(torch.int64).view(-1, 1)
    columns = start_offset[:batch_size].to(torch.int64).view(-1, 1) + torch.arange(
        draft_token_num, device=req_to_token.device).view(1, -1)
    return req_to_token[rows, columns].reshape(-1).to(torch.int64)


def _extend_cache_locs_accesses(out: torch.Tensor, req_pool_indices: torch.Tensor,
                                req_to_token: torch.Tensor, start_offset: torch.Tensor,
                                batch_size: int, draft_token_num: int, device: Any,
                                **options: Any) -> list[DeclaredAccess]:
    acc = reads(req_pool_indices) + reads(start_offset) + writes(out)
    for row, start in draft_windows(req_pool_indices[:batch_size], start_offset[:batch_size]):
        acc += reads(req_to_token[row, start:start + draft_token_num])
    return acc


# -- spec_utils.move_accept_tokens_to_target_kvcache's slot packing (topk > 1) -----------


def _fill_front(num_front: torch.Tensor, out_cache_loc: torch.Tensor,
                front_out_cache_loc: torch.Tensor) -> None:
    """The first ``num_front[i]`` slots of request ``i``'s window, packed in order."""
    counts = peek(num_front)
    window = peek(out_cache_loc.view(len(counts), -1))
    packed = [slot for row, count in zip(window, counts, strict=True) for slot in row[:count]]
    if packed:
        front_out_cache_loc[:len(packed)] = device_tensor(packed, front_out_cache_loc)


def _fill_front_accesses(out: Any, num_front: torch.Tensor, out_cache_loc: torch.Tensor,
                         front_out_cache_loc: torch.Tensor) -> list[DeclaredAccess]:
    return reads(num_front) + reads(out_cache_loc) + writes(front_out_cache_loc)


def _fill_accept(accept_index: torch.Tensor, out_cache_loc: torch.Tensor,
                 accept_out_cache_loc: torch.Tensor, size: int) -> None:
    """The slots of the accepted nodes (``-1``: none), packed in order."""
    slots = peek(out_cache_loc)
    packed = [slots[node] for node in peek(accept_index.reshape(-1))[:size] if node > -1]
    if packed:
        accept_out_cache_loc[:len(packed)] = device_tensor(packed, accept_out_cache_loc)


def _fill_accept_accesses(out: Any, accept_index: torch.Tensor, out_cache_loc: torch.Tensor,
                          accept_out_cache_loc: torch.Tensor, size: int
                          ) -> list[DeclaredAccess]:
    return reads(accept_index) + reads(out_cache_loc) + writes(accept_out_cache_loc)


#: sgl_kernel's CUDA tree builder, as older releases' eagle_utils names it (imported only on
#: a CUDA host, so absent here)
SGL_TREE_BUILDER = "sgl_build_tree_kernel_efficient"


def _cuda_only_tree_builder_named() -> None:
    """Where the release's ``build_tree_kernel_efficient`` calls sgl_kernel's CUDA tree
    builder by a name its CPU import never bound (0.5.17), bind that name to a strict
    stand-in, so that the declaration below replaces it inside a watch (CPU mode computes
    the declared implementation) and a call outside one fails loudly."""
    import importlib

    from overlap_harness.engines.core.strict import unplanned

    module = importlib.import_module("sglang.srt.speculative.eagle_utils")
    caller = getattr(module, "build_tree_kernel_efficient", None)
    if (caller is not None and SGL_TREE_BUILDER in caller.__code__.co_names
            and not hasattr(module, SGL_TREE_BUILDER)):
        setattr(module, SGL_TREE_BUILDER,
                unplanned(f"sgl_kernel.build_tree_kernel_efficient (as {SGL_TREE_BUILDER}: "
                          "a CUDA kernel, run only as declared)"))


def declare() -> None:
    """Register the declarations (idempotent)."""
    _cuda_only_tree_builder_named()
    for target, accesses, impl, name in (
            (f"sglang.srt.speculative.eagle_utils:{SGL_TREE_BUILDER}",
             _build_tree_accesses, _build_tree, "sgl_build_tree_kernel_efficient"),
            ("sglang.srt.speculative.eagle_utils:build_tree_kernel_efficient_func",
             _build_tree_accesses, _build_tree, "sgl_build_tree_kernel_efficient"),
            ("sglang.kernels.ops.speculative.cache_locs:assign_extend_cache_locs_uniform_func",
             _extend_cache_locs_accesses, _extend_cache_locs, "assign_extend_cache_locs_uniform"),
            ("sglang.srt.speculative.spec_utils:fill_front_out_cache_loc_func",
             _fill_front_accesses, _fill_front, "assign_extend_cache_locs"),
            ("sglang.srt.speculative.spec_utils:fill_accept_out_cache_loc_func",
             _fill_accept_accesses, _fill_accept, "fill_accept_out_cache_loc")):
        recorder.declare_kernel(target, accesses, cpu_impl=impl, name=name)
