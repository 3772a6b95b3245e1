"""Stand-ins for what SGLang's multi-layer EAGLE draft-extend CUDA-graph runners run that
needs weights or Triton (the feature: :mod:`..features.multi_layer_draft_extend_graph`).

SGLang's runners (``MultiLayerEagleMultiStepDraftExtendCudaGraphRunner``, one graph per draft
step, and ``OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner``, every step in one
graph, ``SGLANG_ENABLE_SINGLE_CG_DRAFT``) capture each step's draft extend
(``DRAFT_EXTEND_V2``, ``num_steps + 1`` tokens per request, widened by the boundary-KV
window's front rows where the worker turned the window on: the runner's
``captured_req_width``) over one shared set of static buffers; the model's hidden-state
buffer is sized by that width (the feature's ``captured_request_width``). What stands in here:

* :class:`StepGraphBackend`: step ``step``'s draft-extend attention backend, one object for
  the eager path and the graphs, as SGLang's is: its eager ``init_forward_metadata`` is the
  step's planning stand-in's (:func:`.eagle_models.planning_backend`, declared), its in-graph
  metadata prep one declared op that reads the static rows and lengths (the lengths after the
  extend) and each row's ``req_to_token[row, :seq_len]`` and writes the backend's private
  KV-index copy. It rebuilds the replay's metadata inside the graph
  (``draft_extend_metadata_captured_in_graph`` True, as FlashAttention-3's and FlashMLA's
  do), so SGLang's worker may capture every step in one graph and the replay plans nothing
  out of the graph; it stages nothing before the verify
  (``supports_draft_extend_metadata_staging`` False: FlashAttention-3 answers True for topk
  1, but SGLang stages only for backends that do not capture the metadata in the graph, so
  its path is the same).
* :class:`StepGraphModel`: ``model_runner_list[step].model`` for the capture: the step's draft
  layer inside the graph, one declared op: reads the static tokens, positions, carried hidden
  states, write slots, ``select_index``, the private KV indices and the step's draft KV they
  name; writes the step's draft KV of the slots, the selected rows' logits and the hidden
  states. Its values are the eager fake draft's (:mod:`.eagle_models`: logits a function of
  the position, hidden states the token), so graph and eager accept the same drafts.
* ``fill_draft_extend_prepare_buffers`` (the runner's ``prepare``: SGLang's one Triton launch
  that fills the shared static buffers from the batch), declared where the runner module
  looks it up: the accesses of the Triton kernel (every token buffer written to its end,
  the request buffers, the hidden window's real rows), the values from SGLang's own torch
  version of it (``fill_draft_extend_prepare_buffers_native``, its NPU branch) plus the tail
  the Triton kernel zeroes. ``rotate_input_ids`` is declared in the runner module too (the
  one-graph runner rotates inside the graph) with :mod:`.multi_layer_eagle_models`' stand-in.
"""

from __future__ import annotations

from typing import Any

import torch

import overlap_harness.recorder as recorder
from overlap_harness.engines.sglang.stand_ins import eagle_models, multi_layer_eagle_models
from overlap_harness.engines.sglang.stand_ins.graph_attention import (
    PrivateIndexBackend,
    _kernel_values,
    _static_rows,
    copy_row_kv_indices,
    private_index_accesses,
)
from overlap_harness.recorder.kernels import DeclaredAccess, declared, reads, writes

RUNNER_MODULE = "sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner"
UTILS_MODULE = "sglang.srt.speculative.multi_layer_eagle_utils"


def _prep_accesses(result: Any, backend: StepGraphBackend, forward_batch: Any
                   ) -> list[DeclaredAccess]:
    return private_index_accesses(backend, forward_batch, _static_rows(
        forward_batch.req_pool_indices, forward_batch.seq_lens))


@declared(_prep_accesses, name="multi_layer_draft_extend_metadata_prep_in_graph")
def _metadata_prep(backend: StepGraphBackend, forward_batch: Any) -> None:
    """The step backend's private copy of each row's KV indices (prefix and window)."""
    with _kernel_values():  # device work only: captured (stand_ins/graph_attention.py)
        copy_row_kv_indices(backend, forward_batch.req_pool_indices, forward_batch.seq_lens)


class StepGraphBackend(PrivateIndexBackend):
    """Draft step ``step``'s draft-extend attention backend: the eager planning of
    ``eager`` (a strict planning stand-in, whose other fields it answers too) and the graph
    interface, its metadata rebuilt inside the graph."""

    supports_draft_extend_metadata_staging = False
    on_after_cuda_graph_warmup = None  # no buffers to reset after the warm-up forwards

    def __init__(self, eager: Any, req_to_token: torch.Tensor) -> None:
        super().__init__(req_to_token)
        self.eager = eager
        self.needs_cpu_seq_lens = eager.needs_cpu_seq_lens

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "eager":
            raise AttributeError(name)
        return getattr(self.eager, name)  # strict: an unplanned field fails there

    @property
    def forward_metadata(self) -> Any:
        """The page table the eager planning wrote (what an eager forward reads)."""
        return self.eager.forward_metadata

    def init_forward_metadata(self, forward_batch: Any) -> None:
        """Eager planning (prefill's draft extend, an eager fallback): the stand-in's."""
        self.eager.init_forward_metadata(forward_batch)

    def draft_extend_metadata_captured_in_graph(self) -> bool:
        """The replay's metadata is rebuilt inside the graph (nothing out of the graph)."""
        return True

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        """Captured: the private copy of the shared ``req_to_token`` rows."""
        _metadata_prep(self, forward_batch)


def _selected(forward_batch: Any) -> torch.Tensor | None:
    select = getattr(forward_batch.spec_info, "select_index", None)
    return None if select is None else select.to(torch.int64)


def _output_rows(forward_batch: Any) -> int:
    """Logit rows the step outputs: one per request where the runner prunes the logits to
    each request's last accepted token (``select_index``), else one per token."""
    select = getattr(forward_batch.spec_info, "select_index", None)
    return select.shape[0] if select is not None else forward_batch.input_ids.shape[0]


def _step_accesses(result: Any, model: StepGraphModel, forward_batch: Any
                   ) -> list[DeclaredAccess]:
    backend, runner = model.backend, model.runner
    bs = forward_batch.batch_size
    spec = forward_batch.spec_info
    with _kernel_values():
        used = int(backend.kv_indptr[bs].item())
    out = reads(forward_batch.input_ids) + reads(forward_batch.positions)
    out += reads(spec.hidden_states)
    if getattr(spec, "select_index", None) is not None:
        out += reads(spec.select_index)
    out += reads(forward_batch.out_cache_loc) + reads(backend.kv_indptr[:bs + 1])
    out += writes(runner.kv_buffer, rows=forward_batch.out_cache_loc)
    entries = backend.kv_indices[:used]
    out += reads(entries) + reads(runner.kv_buffer, rows=entries)
    rows = _output_rows(forward_batch)
    return (out + writes(forward_batch.next_token_logits_buffer[:rows])
            + writes(model.hidden_buffer[:forward_batch.input_ids.shape[0]]))


@declared(_step_accesses, name="multi_layer_draft_extend_step_in_graph")
def _step_forward(model: StepGraphModel, forward_batch: Any) -> None:
    """The eager fake draft's values: logits of each output row a function of its position,
    hidden states the token."""
    with _kernel_values():
        model.runner.kv_buffer.index_fill_(
            0, forward_batch.out_cache_loc.to(torch.int64), 1.0)  # no host scalar in a capture
        positions = forward_batch.positions
        select = _selected(forward_batch)
        if select is not None:
            positions = positions[select]
        logits = eagle_models.logits_of(positions + 1, 1)
        forward_batch.next_token_logits_buffer[:logits.shape[0]].copy_(logits)
        tokens = forward_batch.input_ids
        model.hidden_buffer[:tokens.shape[0]].copy_(
            tokens.to(torch.float32).view(-1, 1).expand(-1, eagle_models.HIDDEN))


class StepGraphModel:
    """``model_runner_list[step].model`` for the graphs: ``forward(input_ids, positions,
    forward_batch)`` -> SGLang's ``LogitsProcessorOutput``."""

    shared_experts_config = None

    def __init__(self, runner: Any, backend: StepGraphBackend, max_tokens: int) -> None:
        self.runner = runner
        self.backend = backend
        self.hidden_buffer = torch.zeros((max_tokens, eagle_models.HIDDEN),
                                         dtype=torch.float32, device="cuda")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        _step_forward(self, forward_batch)
        return LogitsProcessorOutput(
            next_token_logits=forward_batch.next_token_logits_buffer[
                :_output_rows(forward_batch)],
            hidden_states=self.hidden_buffer[:input_ids.shape[0]])


# -- the runner's prepare: fill_draft_extend_prepare_buffers ------------------------------

#: the positional parameters of SGLang's fill_draft_extend_prepare_buffers (0.5.17-0.5.23)
FILL_PARAMETERS = (
    "input_ids", "positions", "out_cache_loc", "src_input_ids", "src_positions",
    "src_out_cache_loc", "seq_lens", "req_pool_indices", "num_correct_drafts",
    "num_accept_tokens", "select_index", "temperatures", "src_seq_lens",
    "src_req_pool_indices", "src_num_correct_drafts", "src_num_accept_tokens",
    "src_temperatures", "hidden_states", "src_hidden_states", "global_num_tokens",
    "global_num_tokens_for_logprob", "raw_bs", "bs", "num_tokens_per_bs", "num_front_tokens",
    "seq_len_fill_value")


def _fill_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    if len(args) > len(FILL_PARAMETERS):
        raise TypeError("fill_draft_extend_prepare_buffers: more arguments than declared")
    given = dict(zip(FILL_PARAMETERS, args, strict=False))
    unknown = set(kwargs) - set(FILL_PARAMETERS)
    if unknown:
        raise TypeError(f"fill_draft_extend_prepare_buffers: undeclared {sorted(unknown)}")
    given.update(kwargs)
    missing = set(FILL_PARAMETERS) - set(given)
    if missing:
        raise TypeError(f"fill_draft_extend_prepare_buffers: missing {sorted(missing)}")
    return given


def _fill_accesses(result: Any, *args: Any, **kwargs: Any) -> list[DeclaredAccess]:
    """The Triton kernel's: every token buffer written to its end (real rows from the
    sources, the tail zeroed), ``seq_lens`` written whole, the real rows of the other
    request buffers and the padded rows' pad values, ``select_index`` from the (real, or
    stale for padded rows) correct-draft counts, the hidden window's real rows."""
    a = _fill_arguments(args, kwargs)
    raw_bs, bs = a["raw_bs"], a["bs"]
    tokens = a["src_input_ids"].shape[0]
    out = reads(a["src_input_ids"]) + reads(a["src_positions"]) + reads(a["src_out_cache_loc"])
    out += writes(a["input_ids"]) + writes(a["positions"]) + writes(a["out_cache_loc"])
    out += reads(a["src_seq_lens"][:raw_bs]) + writes(a["seq_lens"])
    out += reads(a["src_req_pool_indices"][:raw_bs]) + writes(a["req_pool_indices"][:raw_bs])
    out += reads(a["src_num_correct_drafts"][:raw_bs])
    out += reads(a["num_correct_drafts"][raw_bs:bs]) + writes(a["num_correct_drafts"][:raw_bs])
    out += reads(a["src_num_accept_tokens"][:raw_bs]) + writes(a["num_accept_tokens"][:bs])
    out += writes(a["select_index"][:bs])
    if a["temperatures"] is not None:
        out += reads(a["src_temperatures"][:raw_bs]) + writes(a["temperatures"][:bs])
    if a["global_num_tokens"] is not None:
        out += writes(a["global_num_tokens"]) + writes(a["global_num_tokens_for_logprob"])
    if a["src_hidden_states"] is not None:
        out += reads(a["src_hidden_states"]) + writes(a["hidden_states"][:tokens])
    return out


def _fill_values(*args: Any, **kwargs: Any) -> None:
    """SGLang's own torch version (its NPU branch) and the tails the Triton kernel zeroes
    (token buffers past the real rows) or resets (``seq_lens`` past the bucket)."""
    import importlib

    native = importlib.import_module(UTILS_MODULE).fill_draft_extend_prepare_buffers_native
    a = _fill_arguments(args, kwargs)
    native(*args, **kwargs)
    tokens = a["src_input_ids"].shape[0]
    for name in ("input_ids", "positions", "out_cache_loc"):
        a[name][tokens:].zero_()
    a["seq_lens"][a["bs"]:].fill_(a["seq_len_fill_value"])


def declare() -> None:
    """Register the declarations (idempotent)."""
    recorder.declare_kernel(f"{RUNNER_MODULE}:fill_draft_extend_prepare_buffers",
                            _fill_accesses, cpu_impl=_fill_values,
                            name="fill_draft_extend_prepare_buffers")
    recorder.declare_kernel(f"{RUNNER_MODULE}:rotate_input_ids",
                            multi_layer_eagle_models.rotate_accesses,
                            cpu_impl=multi_layer_eagle_models.rotated,
                            name="rotate_input_ids_kernel")
