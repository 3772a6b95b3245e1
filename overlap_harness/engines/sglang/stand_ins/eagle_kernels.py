"""SGLang's Triton kernels on the EAGLE v2 path, declared to the recorder.

Each kernel is declared where the path looks it up (``"module:function"`` of the module that
calls it), with what it reads and writes and a CPU implementation of the same values: the
recorder fakes CUDA on a CPU, where Triton cannot launch. The implementations read device
values through :func:`~overlap_harness.engines.sglang.stand_ins.eagle_models.peek` (the kernel reads
them on the device: no host read is recorded) and write their outputs with device ops (in the
declared call, not recorded one by one).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

import overlap_harness.recorder as recorder
from overlap_harness.engines.sglang.stand_ins import eagle_tree_kernels, eagle_verify_kernels
from overlap_harness.engines.sglang.stand_ins.eagle_models import device_tensor, draft_windows, peek
from overlap_harness.recorder.kernels import DeclaredAccess, reads, writes

# -- forward_batch_info.compute_position_triton ------------------------------------------


def _positions(extend_prefix_lens: torch.Tensor, extend_seq_lens: torch.Tensor,
               extend_seq_lens_sum: int) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = peek(extend_seq_lens)
    has_prefix = extend_prefix_lens.shape[0] == len(lengths)
    prefixes = peek(extend_prefix_lens) if has_prefix else [0] * len(lengths)
    positions: list[int] = []
    starts: list[int] = []
    for prefix, length in zip(prefixes, lengths, strict=True):
        starts.append(len(positions))
        positions += range(prefix, prefix + length)
    return (device_tensor(positions, extend_seq_lens, torch.int64),
            device_tensor(starts, extend_seq_lens, torch.int32))


def _positions_accesses(out: Any, extend_prefix_lens: torch.Tensor,
                        extend_seq_lens: torch.Tensor, extend_seq_lens_sum: int
                        ) -> list[DeclaredAccess]:
    positions, starts = out
    return (reads(extend_prefix_lens) + reads(extend_seq_lens) + writes(positions)
            + writes(starts))


# -- mem_cache.allocation.assign_req_to_token_pool_func -----------------------------------


def _assign_rows(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                 out_cache_loc: torch.Tensor, batch_size: int) -> list[tuple[int, int, int]]:
    """(row, start, end) of each request, as the kernel reads them."""
    return list(zip(peek(req_pool_indices)[:batch_size], peek(start_offset)[:batch_size],
                    peek(end_offset)[:batch_size], strict=True))


def _assign_req_to_token_pool(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                              start_offset: torch.Tensor, end_offset: torch.Tensor,
                              out_cache_loc: torch.Tensor, batch_size: int) -> None:
    """Each request's row gets the next ``end - start`` slots of ``out_cache_loc`` at
    columns ``start:end`` (requests in order)."""
    taken = 0
    for row, start, end in _assign_rows(req_pool_indices, req_to_token, start_offset,
                                        end_offset, out_cache_loc, batch_size):
        req_to_token[row, start:end] = out_cache_loc[taken:taken + end - start].to(
            req_to_token.dtype)
        taken += end - start


def _assign_accesses(out: Any, req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                     start_offset: torch.Tensor, end_offset: torch.Tensor,
                     out_cache_loc: torch.Tensor, batch_size: int) -> list[DeclaredAccess]:
    acc = reads(req_pool_indices) + reads(start_offset) + reads(end_offset)
    acc += reads(out_cache_loc)
    for row, start, end in _assign_rows(req_pool_indices, req_to_token, start_offset,
                                        end_offset, out_cache_loc, batch_size):
        acc += writes(req_to_token[row, start:end])
    return acc


# -- managers.overlap_utils.gather_spec_extras (FutureMap's fused gather) -----------------


def _gather_spec_extras(indices: torch.Tensor, topk_p_buf: torch.Tensor,
                        topk_index_buf: torch.Tensor, output_tokens_buf: torch.Tensor,
                        hidden_states_buf: torch.Tensor | None) -> tuple[Any, ...]:
    """The rows ``indices`` of each relay buffer (fresh tensors)."""
    rows = indices.to(torch.int64)
    hidden = hidden_states_buf[rows].clone() if hidden_states_buf is not None else None
    return (topk_p_buf[rows].clone(), topk_index_buf[rows].clone(),
            output_tokens_buf[rows].clone(), hidden)


def _gather_accesses(out: Any, indices: torch.Tensor, topk_p_buf: torch.Tensor,
                     topk_index_buf: torch.Tensor, output_tokens_buf: torch.Tensor,
                     hidden_states_buf: torch.Tensor | None) -> list[DeclaredAccess]:
    acc = reads(indices)
    for buf in (topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf):
        acc += reads(buf, rows=indices) if buf is not None else []
    for result in out:
        acc += writes(result)
    return acc


# -- kernels.ops.speculative.cache_locs.assign_draft_cache_locs_contiguous_func ----------


def _assign_draft_cache_locs(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                             seq_lens: torch.Tensor, out_cache_loc: torch.Tensor, topk: int,
                             num_cols: int, positions: torch.Tensor | None = None,
                             mrope: torch.Tensor | None = None) -> None:
    """Each request's ``topk * num_cols`` slots from column ``seq_len`` of its row, in
    request order; its draft position (``seq_len``) per branch."""
    width = topk * num_cols
    for lane, (row, start) in enumerate(draft_windows(req_pool_indices, seq_lens)):
        out_cache_loc[lane * width:(lane + 1) * width] = req_to_token[
            row, start:start + width].to(out_cache_loc.dtype)
        if positions is not None:
            positions[lane * topk:(lane + 1) * topk] = start
    if mrope is not None:
        raise NotImplementedError("assign_draft_cache_locs: mrope is not planned")


def _assign_draft_cache_locs_accesses(out: Any, req_pool_indices: torch.Tensor,
                                      req_to_token: torch.Tensor, seq_lens: torch.Tensor,
                                      out_cache_loc: torch.Tensor, topk: int, num_cols: int,
                                      positions: torch.Tensor | None = None,
                                      mrope: torch.Tensor | None = None
                                      ) -> list[DeclaredAccess]:
    acc = reads(req_pool_indices) + reads(seq_lens) + writes(out_cache_loc) + writes(positions)
    for row, start in draft_windows(req_pool_indices, seq_lens):
        acc += reads(req_to_token[row, start:start + topk * num_cols])
    return acc


def _raw_assign_arguments(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                          seq_lens: torch.Tensor, out_cache_loc: torch.Tensor, pool_len: int,
                          topk: int, num_cols: int, positions: torch.Tensor | None = None,
                          mrope: torch.Tensor | None = None, **launch: Any) -> tuple:
    """The wrapper's arguments from a raw launch of the Triton kernel
    (``kernel[(bs,)](..., pool_len, topk, num_cols, positions=, mrope=, BS=, ...)``: older
    releases launch it themselves); the launch's grid and constexpr flags follow from them."""
    return req_pool_indices, req_to_token, seq_lens, out_cache_loc, topk, num_cols, \
        positions, mrope


def _raw_assign_draft_cache_locs(*args: Any, **kwargs: Any) -> None:
    _assign_draft_cache_locs(*_raw_assign_arguments(*args, **kwargs))


def _raw_assign_draft_cache_locs_accesses(out: Any, *args: Any, **kwargs: Any
                                          ) -> list[DeclaredAccess]:
    return _assign_draft_cache_locs_accesses(out, *_raw_assign_arguments(*args, **kwargs))


# -- kernels.ops.speculative.eagle.build_chain_tree ---------------------------------------


def _build_chain_tree(bonus_tokens: torch.Tensor, draft_tokens: torch.Tensor,
                      seq_lens: torch.Tensor, tree_mask_buf: torch.Tensor | None = None,
                      req_pool_indices: torch.Tensor | None = None,
                      req_to_token: torch.Tensor | None = None, with_mrope: bool = False
                      ) -> tuple[Any, ...]:
    """A chain tree per request: tokens (bonus, then the drafts), positions
    ``seq_len + column``, causal mask, retrieve index / next token / next sibling, and the
    verify slots ``req_to_token[row, seq_len + column]``."""
    if with_mrope:
        raise NotImplementedError("build_chain_tree: mrope is not planned")
    bs, depth = draft_tokens.shape
    width = depth + 1
    device = seq_lens.device
    mask = tree_mask_buf if tree_mask_buf is not None else torch.empty(
        (bs * width * width,), dtype=torch.bool, device=device)
    column = torch.arange(width, device=device)
    mask[:bs * width * width] = (column.view(1, width) <= column.view(width, 1)).reshape(
        -1).repeat(bs)
    positions = (seq_lens.to(torch.int64).view(bs, 1) + column.view(1, width)).reshape(-1)
    retrieve = torch.empty((3, bs, width), dtype=torch.int64, device=device)
    retrieve[0] = torch.arange(bs * width, device=device).view(bs, width)
    retrieve[1] = torch.where(column + 1 < width, column + 1, -1).view(1, width)
    retrieve[2] = -1
    dtype = torch.promote_types(bonus_tokens.dtype, draft_tokens.dtype)
    tokens = torch.cat([bonus_tokens.to(dtype).view(bs, 1), draft_tokens.to(dtype)],
                       dim=1).reshape(-1)
    out_cache_loc = None
    if req_to_token is not None:
        rows = req_pool_indices.to(torch.int64).view(bs, 1).expand(bs, width).reshape(-1)
        out_cache_loc = req_to_token[rows, positions].to(torch.int64)
    return mask, positions, retrieve[0], retrieve[1], retrieve[2], tokens, out_cache_loc, None


def _build_chain_tree_accesses(out: Any, bonus_tokens: torch.Tensor,
                               draft_tokens: torch.Tensor, seq_lens: torch.Tensor,
                               tree_mask_buf: torch.Tensor | None = None,
                               req_pool_indices: torch.Tensor | None = None,
                               req_to_token: torch.Tensor | None = None,
                               with_mrope: bool = False) -> list[DeclaredAccess]:
    mask, positions, retrieve_index, next_token, next_sibling, tokens, out_cache_loc, _ = out
    width = draft_tokens.shape[1] + 1
    acc = reads(bonus_tokens) + reads(draft_tokens) + reads(seq_lens)
    acc += writes(mask) + writes(positions) + writes(retrieve_index) + writes(next_token)
    acc += writes(next_sibling) + writes(tokens) + writes(out_cache_loc)
    if req_to_token is not None:
        acc += reads(req_pool_indices)
        for row, start in draft_windows(req_pool_indices, seq_lens):
            acc += reads(req_to_token[row, start:start + width])
    return acc


# -- kernels.ops.speculative.eagle: verify commit and draft-extend layouts ----------------


def _commit_outputs(predict: torch.Tensor, accept_index: torch.Tensor,
                    accept_lens: torch.Tensor, seq_lens: torch.Tensor,
                    num_draft_tokens: int = 0, mamba_track_interval: int = 0) -> tuple[Any, ...]:
    """New lengths (``seq_len + accepted``), the bonus token (the last accepted node's
    prediction) and, with ``num_draft_tokens``, the draft-extend inputs."""
    if mamba_track_interval:
        raise NotImplementedError("prepare_verify_commit_outputs: mamba tracking")
    bs = accept_lens.numel()
    accepted = accept_lens.to(torch.int64)
    last = accept_index.to(torch.int64).gather(1, (accepted - 1).view(bs, 1)).view(bs)
    new_seq_lens = (seq_lens + accepted).to(torch.promote_types(seq_lens.dtype,
                                                                 accept_lens.dtype))
    last = torch.where(last < 0, last + predict.numel(), last)
    bonus = predict[last].to(torch.int32)
    if not num_draft_tokens:
        return new_seq_lens, bonus
    lane = torch.arange(bs, device=seq_lens.device)
    last_steps = last - lane * num_draft_tokens
    correct = (accepted - 1).to(accept_lens.dtype)
    select = lane * num_draft_tokens + accepted - 1
    return new_seq_lens, bonus, (last_steps, None), (correct, select, predict.to(torch.int64))


def _commit_accesses(out: Any, predict: torch.Tensor, accept_index: torch.Tensor,
                     accept_lens: torch.Tensor, seq_lens: torch.Tensor,
                     num_draft_tokens: int = 0, mamba_track_interval: int = 0
                     ) -> list[DeclaredAccess]:
    acc = reads(predict) + reads(accept_index) + reads(accept_lens) + reads(seq_lens)
    acc += writes(out[0]) + writes(out[1])
    if num_draft_tokens:
        acc += writes(out[2][0])
        acc += writes(out[3][0]) + writes(out[3][1]) + writes(out[3][2])
    return acc


def _draft_extend_inputs(accept_lens: torch.Tensor, predict: torch.Tensor,
                         num_draft_tokens: int) -> tuple[torch.Tensor, ...]:
    """Correct drafts per request, the row of its last accepted token, the tokens."""
    lane = torch.arange(accept_lens.numel(), device=accept_lens.device)
    return (accept_lens - 1, lane * num_draft_tokens + accept_lens.to(torch.int64) - 1,
            predict.reshape(-1).to(torch.int64))


def _draft_extend_inputs_accesses(out: Any, accept_lens: torch.Tensor, predict: torch.Tensor,
                                  num_draft_tokens: int) -> list[DeclaredAccess]:
    return reads(accept_lens) + reads(predict) + [w for t in out for w in writes(t)]


def _draft_extend_layout(seq_lens: torch.Tensor, num_draft_tokens: int, with_mrope: bool
                         ) -> tuple[Any, ...]:
    """Prefix lengths (``seq_len``), extend lengths (the tree width), post-write lengths,
    and each token's position and each request's start in the flat batch."""
    if with_mrope:
        raise NotImplementedError("prepare_draft_extend_layout: mrope is not planned")
    bs = seq_lens.numel()
    prefix = seq_lens.to(torch.int32)
    extend = torch.full((bs,), num_draft_tokens, dtype=torch.int32, device=seq_lens.device)
    post = seq_lens + num_draft_tokens
    column = torch.arange(num_draft_tokens, device=seq_lens.device)
    positions = (seq_lens.to(torch.int64).view(bs, 1) + column.view(1, -1)).reshape(-1)
    starts = (torch.arange(bs, device=seq_lens.device) * num_draft_tokens).to(torch.int32)
    return prefix, extend, post, (positions, starts, None)


def _draft_extend_layout_accesses(out: Any, seq_lens: torch.Tensor, num_draft_tokens: int,
                                  with_mrope: bool) -> list[DeclaredAccess]:
    prefix, extend, post, (positions, starts, _) = out
    return (reads(seq_lens) + writes(prefix) + writes(extend) + writes(post)
            + writes(positions) + writes(starts))


# -- kernels.ops.speculative.topk1.draft_topk1_postprocess ---------------------------------


def _topk1(next_token_logits: torch.Tensor, positions: torch.Tensor,
           draft_tokens: torch.Tensor | None = None, draft_token_column: int = 0
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's argmax (probability 1), written into the draft chain's column when given;
    the positions advance by one."""
    topk_index = torch.argmax(next_token_logits, dim=-1, keepdim=True)
    if draft_tokens is not None:
        draft_tokens[:, draft_token_column] = topk_index.view(-1)
    positions.add_(1)
    return torch.ones_like(topk_index, dtype=torch.float32), topk_index


def _topk1_accesses(out: Any, next_token_logits: torch.Tensor, positions: torch.Tensor,
                    draft_tokens: torch.Tensor | None = None, draft_token_column: int = 0
                    ) -> list[DeclaredAccess]:
    acc = reads(next_token_logits) + reads(positions) + writes(positions)
    if draft_tokens is not None:
        acc += writes(draft_tokens[:, draft_token_column])
    return acc + writes(out[0]) + writes(out[1])


# -- kernels.ops.speculative.spec_tree.verify_tree_greedy_func -----------------------------


def _verify_greedy(predicts: torch.Tensor, accept_index: torch.Tensor,
                   accept_token_num: torch.Tensor, candidates: torch.Tensor,
                   retrieve_index: torch.Tensor, retrieve_next_token: torch.Tensor,
                   retrieve_next_sibling: torch.Tensor, target_predict: torch.Tensor,
                   topk: int = -1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk each request's tree from the root: a child is accepted when its token is the
    target's prediction at its parent; every visited node's prediction is recorded."""
    cand, r_index = peek(candidates), peek(retrieve_index)
    r_next, r_sibling, target = peek(retrieve_next_token), peek(retrieve_next_sibling), peek(
        target_predict)
    depth = accept_index.shape[1]
    flat_predicts = peek(predicts)
    index_rows, counts = [], []
    for lane in range(len(cand)):
        node, accepted = 0, [r_index[lane][0]]
        flat_predicts[r_index[lane][0]] = target[lane][0]
        while len(accepted) < depth:
            child = r_next[lane][node]
            while child != -1 and cand[lane][child] != target[lane][node]:
                child = r_sibling[lane][child]
            if child == -1:
                break
            node = child
            accepted.append(r_index[lane][node])
            flat_predicts[r_index[lane][node]] = target[lane][node]
        counts.append(len(accepted) - 1)
        index_rows.append(accepted + [-1] * (depth - len(accepted)))
    predicts.copy_(device_tensor(flat_predicts, predicts))
    if index_rows:
        accept_index.copy_(device_tensor(index_rows, accept_index))
        accept_token_num.copy_(device_tensor(counts, accept_token_num))
    return predicts, accept_index, accept_token_num


def _verify_greedy_accesses(out: Any, predicts: torch.Tensor, accept_index: torch.Tensor,
                            accept_token_num: torch.Tensor, candidates: torch.Tensor,
                            retrieve_index: torch.Tensor, retrieve_next_token: torch.Tensor,
                            retrieve_next_sibling: torch.Tensor, target_predict: torch.Tensor,
                            topk: int = -1) -> list[DeclaredAccess]:
    acc = reads(candidates) + reads(retrieve_index) + reads(retrieve_next_token)
    acc += reads(retrieve_next_sibling) + reads(target_predict)
    return acc + writes(predicts) + writes(accept_index) + writes(accept_token_num)


def declare() -> None:
    """Register the declarations (idempotent)."""
    recorder.declare_kernel("sglang.srt.model_executor.forward_batch_info:"
                            "compute_position_triton", _positions_accesses,
                            cpu_impl=_positions, name="compute_position_kernel")
    for module in ("sglang.srt.mem_cache.allocation", "sglang.srt.speculative.spec_utils"):
        recorder.declare_kernel(f"{module}:assign_req_to_token_pool_func", _assign_accesses,
                                cpu_impl=_assign_req_to_token_pool,
                                name="assign_req_to_token_pool")
    recorder.declare_kernel("sglang.srt.managers.overlap_utils:gather_spec_extras",
                            _gather_accesses, cpu_impl=_gather_spec_extras,
                            name="_gather_rows_kernel")
    common = "sglang.srt.speculative.eagle_worker_common"
    for target, accesses, impl, name in (
            (f"{common}:assign_draft_cache_locs_contiguous_func",
             _assign_draft_cache_locs_accesses, _assign_draft_cache_locs,
             "assign_draft_cache_locs_contiguous"),
            (f"{common}:build_chain_tree", _build_chain_tree_accesses, _build_chain_tree,
             "_build_chain_tree_kernel"),
            (f"{common}:prepare_verify_commit_outputs", _commit_accesses, _commit_outputs,
             "_verify_commit_outputs_kernel"),
            ("sglang.kernels.ops.speculative.eagle:prepare_draft_extend_inputs",
             _draft_extend_inputs_accesses, _draft_extend_inputs,
             "_draft_extend_inputs_kernel"),
            (f"{common}:prepare_draft_extend_layout", _draft_extend_layout_accesses,
             _draft_extend_layout, "_prepare_draft_extend_lengths_kernel"),
            ("sglang.srt.speculative.eagle_worker_v2:draft_topk1_postprocess",
             _topk1_accesses, _topk1, "_draft_topk1_finalize_kernel"),
            # HIP's draft extend: draft_topk1_argmax_only calls it in its own module
            ("sglang.kernels.ops.speculative.topk1:draft_topk1_postprocess",
             _topk1_accesses, _topk1, "_draft_topk1_finalize_kernel"),
            ("sglang.srt.speculative.eagle_utils:verify_tree_greedy_func",
             _verify_greedy_accesses, _verify_greedy, "verify_tree_greedy")):
        recorder.declare_kernel(target, accesses, cpu_impl=impl, name=name)
    # releases that launch the Triton kernel itself in the EAGLE path (no wrapper function)
    raw = getattr(importlib.import_module(common), "assign_draft_cache_locs_contiguous", None)
    if raw is not None and hasattr(raw, "run"):
        recorder.declare_kernel(raw, _raw_assign_draft_cache_locs_accesses,
                                cpu_impl=_raw_assign_draft_cache_locs,
                                name="assign_draft_cache_locs_contiguous")
    eagle_tree_kernels.declare()
    eagle_verify_kernels.declare()
