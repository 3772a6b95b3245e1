"""The model forward, cut at the executor's ``forward_step`` (TokenSpeed's
``ForwardStepRunner``: the seam below which only the model, its attention metadata and the
sampling kernels run, eagerly or as a graph replay).

What stands in keeps the forward's memory behaviour on the device: one declared kernel reads
the persistent input buffers the model reads (token ids, positions, sequence lengths, request
slots, this batch's block table) and the sampling backend's state (its pool scalars and the
coin buffers the step's ``prepare_step`` refilled), and writes the sampled ids and accepted
lengths into the backend's packed output buffer, as TokenSpeed's verify/sample kernels do
(so the executor's ``get_packed_output_d2h`` takes its one-copy path). The values: each
request's next token is a function of its last input token (``(id * 7 + 3) % vocab``), so a
committed token sequence shows which input each step read.

With ``graphs``, decode batches replay a CUDA graph captured once per padded batch size over
the same buffers (the recorder's graph model), as TokenSpeed's decode graphs do; the pages a
replay's attention touches come from a static device page list filled before each replay.
With ``draft_width`` k > 0, each decode verifies 1 + k tokens and the drafter writes the next
round's 1 + k input ids into ``runtime_states.future_input_map`` (TokenSpeed's drafter branch
of ``_forward_step``, which replaces ``_update_runtime_state``'s write of that table).
"""

from __future__ import annotations

from typing import Any

import torch

from overlap_harness.engines.tokenspeed.stand_ins.kernels import host_values
from overlap_harness.recorder import declared, reads, writes
from overlap_harness.recorder.sites import not_user_code

not_user_code(__file__)

MAX_GRAPH_PAGES = 16  # a graph's static page list (padded with its last page)


def _next_token(token: int, vocab: int) -> int:
    return (token * 7 + 3) % vocab


def _model_values(input_ids: torch.Tensor, positions: torch.Tensor, seq_lens: torch.Tensor,
                  slots: torch.Tensor, block_table: torch.Tensor | None,
                  coins: torch.Tensor, ends: list[int], width: int, vocab: int,
                  tokens: torch.Tensor, lengths: torch.Tensor, kv: torch.Tensor | None,
                  pages: torch.Tensor | None) -> None:
    if kv is not None and pages is not None:
        kv[pages] += 1.0  # attention: reads the batch's pages, writes its new tokens' KV
    ids = host_values(input_ids)
    for row, end in enumerate(ends):
        last = ids[end - 1]
        for column in range(width):
            tokens[row * width + column] = _next_token(last + column, vocab)
        lengths[row] = width


def _model_accesses(_result: Any, input_ids: torch.Tensor, positions: torch.Tensor,
                    seq_lens: torch.Tensor, slots: torch.Tensor,
                    block_table: torch.Tensor | None, coins: torch.Tensor, ends: list[int],
                    width: int, vocab: int, tokens: torch.Tensor,
                    lengths: torch.Tensor, kv: torch.Tensor | None,
                    pages: torch.Tensor | None) -> list:
    kv_accesses = [] if kv is None else reads(kv, rows=pages) + writes(kv, rows=pages)
    return (reads(input_ids) + reads(positions) + reads(seq_lens) + reads(slots)
            + reads(block_table) + reads(coins) + writes(tokens) + writes(lengths)
            + kv_accesses)


_declared_model = declared(_model_accesses, cpu_impl=_model_values,
                           name="model forward + sampling")(_model_values)


def _draft_values(future_input_map: torch.Tensor, slots: torch.Tensor, tokens: torch.Tensor,
                  width: int, vocab: int) -> None:
    sampled = host_values(tokens)
    for row, slot in enumerate(host_values(slots)):
        last = sampled[row * width + width - 1]
        for column in range(width):
            future_input_map[slot, column] = _next_token(last + column, vocab)


def _draft_accesses(_result: Any, future_input_map: torch.Tensor, slots: torch.Tensor,
                    tokens: torch.Tensor, width: int, vocab: int) -> list:
    return reads(slots) + reads(tokens) + writes(future_input_map, rows=slots)


_declared_draft = declared(_draft_accesses, cpu_impl=_draft_values,
                           name="drafter")(_draft_values)


class ForwardCut:
    """Called as ``executor.forward_step(bs=..., ctx=..., sampling_info=..., ...)``;
    returns ``(output_tokens, output_lengths, output_logprobs, input_token_logprobs)`` as
    ``ForwardStepRunner.__call__`` does (no logprobs)."""

    def __init__(self, executor: Any, vocab: int, *, graphs: bool = False,
                 draft_width: int = 0) -> None:
        self.executor = executor
        self.vocab = vocab
        self.graphs = graphs
        self.draft_width = draft_width
        self.replays = 0
        self._graphs: dict[int, Any] = {}
        self._static_pages: dict[int, torch.Tensor] = {}  # per graph: the pages it touches

    def _run(self, bs: int, ends: list[int], width: int, draft: bool) -> None:
        executor = self.executor
        buffers, backend = executor.input_buffers, executor.sampling_backend
        tokens = backend._output_pack_buf[:bs * width]
        lengths = backend._accept_length_buf[:bs]
        slots = buffers.req_pool_indices_buf[:bs]
        _declared_model(buffers.input_ids_buf[:max(ends)], buffers.positions_buf[:max(ends)],
                        buffers.seq_lens_buf[:bs], slots, self._block_table,
                        backend._coins_buf[:bs], ends, width, self.vocab, tokens, lengths,
                        self._kv, self._pages)
        if draft:
            _declared_draft(executor.runtime_states.future_input_map,
                            buffers.state_write_req_pool_indices_buf[:bs], tokens, width,
                            self.vocab)

    def __call__(self, bs: int, ctx: Any, sampling_info: Any, *, extend_with_prefix: bool,
                 extend_prefix_lens: torch.Tensor, extend_prefix_lens_cpu: torch.Tensor,
                 extend_seq_lens: torch.Tensor, extend_seq_lens_cpu: torch.Tensor,
                 extend_replay_lens_cpu: torch.Tensor, extend_prompt_lens_cpu: torch.Tensor,
                 block_tables_cpu: dict, positions: torch.Tensor | None = None,
                 block_tables: dict | None = None) -> tuple[Any, Any, None, None]:
        self._block_table = next(iter((block_tables or {}).values()), None)
        table_cpu = next(iter(block_tables_cpu.values()), None)
        self._kv = getattr(self.executor.token_to_kv_pool, "kv", None)
        self._pages = None if table_cpu is None else torch.tensor(
            sorted({p for p in table_cpu.flatten().tolist() if p > 0}))
        if self.graphs and ctx.num_extends == 0:  # a replayed graph reads persistent buffers:
            self._block_table = None  # its pages come from the static page list (_replay)
        lengths = ctx.output_layout
        decode = ctx.num_extends == 0
        width = lengths.decode_width if decode else 1
        total = ctx.input_num_tokens
        # each request's last input row, from host values only (the real forward reads no
        # device value on the host: a stand-in that did would add a synchronization)
        ends, end = [], 0
        for length in extend_seq_lens_cpu.tolist():
            end += int(length)
            ends.append(end)
        decode_rows = bs - ctx.num_extends
        per = (total - end) // decode_rows if decode_rows else 0
        ends += [end + per * (row + 1) for row in range(decode_rows)]
        draft = self.draft_width > 0
        backend = self.executor.sampling_backend
        if self.graphs and decode:
            self._replay(bs, ends, width, draft)
        else:
            self._run(bs, ends, width, draft)
        return (backend._output_pack_buf[:bs * width], backend._accept_length_buf[:bs],
                None, None)

    def _replay(self, bs: int, ends: list[int], width: int, draft: bool) -> None:
        """Replay the batch size's graph; its attention reads and writes the pages a static
        device page list names at the replay (filled first on the current stream, from a
        fresh pinned block, as a graph runner copies its inputs into its static buffers), so
        the recorder re-reads the list at each replay rather than keeping the capture's."""
        pages = self._static_pages.get(bs)
        if pages is None:
            pages = self._static_pages[bs] = torch.zeros(MAX_GRAPH_PAGES, dtype=torch.int64,
                                                         device="cuda")
        wanted = [] if self._pages is None else self._pages.tolist()
        if len(wanted) > MAX_GRAPH_PAGES:
            raise RuntimeError(f"a graph batch holds {len(wanted)} pages, the static page "
                               f"list {MAX_GRAPH_PAGES}")
        padded = (wanted + wanted[-1:] * MAX_GRAPH_PAGES)[:MAX_GRAPH_PAGES] or [0]
        staged = torch.tensor(padded, dtype=torch.int64, pin_memory=True)
        pages.copy_(staged, non_blocking=True)
        self._pages = pages
        graph = self._graphs.get(bs)
        if graph is None:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._run(bs, ends, width, draft)
            self._graphs[bs] = graph
        graph.replay()
        self.replays += 1
