"""The harness's DSpark worker: where SGLang's ``DSparkWorkerV2`` stands (the feature:
:mod:`..features.dspark`).

:class:`DsparkWorker` runs the statements of ``DSparkWorkerV2.forward_batch_generation`` on
the confidence-relay path, in its order (prefill: the target forward,
``on_publish(new_seq_lens)``, the next draft input; decode: the draft proposal, the budget,
the verify and accept, ``on_publish(new_seq_lens, confidence=confidence)``, the next draft
input, the result), with SGLang's own verify planner (``DSparkVerifyPlanner``) and the model
forwards as declared ops: the target prefill (:mod:`.eagle_models`'s), the draft proposal
(reads the relayed bonus token, writes the draft tokens and a confidence per draft position)
and the target verify with its greedy accept (reads the verify window's ``req_to_token``
entries and the KV they name, writes the window's KV, the output tokens, commit lengths,
bonus and new lengths).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.sglang.scheduler_build import DEVICE
from overlap_harness.engines.sglang.stand_ins.eagle_models import fill_slots, peek
from overlap_harness.recorder.kernels import DeclaredAccess, declared, reads, writes

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.features.dspark import Dspark


PLANNER_MODULE = "sglang.srt.speculative.dspark_components.dspark_planner"


DRAFT_MODULE = "sglang.srt.speculative.dspark_components.dspark_draft"


def _propose_accesses(out: Any, worker: DsparkWorker, batch: Any) -> list[DeclaredAccess]:
    draft_tokens, confidence = out
    acc = reads(batch.spec_info.bonus_tokens) + reads(batch.req_pool_indices)
    acc += reads(batch.seq_lens)
    return acc + writes(draft_tokens) + writes(confidence)


@declared(_propose_accesses, name="dspark_draft_propose")
def _propose(worker: DsparkWorker, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft block (gamma tokens after the bonus) and the confidence head's survival
    probability of each draft position (in (0, 1), a function of the bonus and position)."""
    bonus = batch.spec_info.bonus_tokens.to(torch.int64).view(-1, 1)
    steps = torch.arange(1, worker.config.gamma + 1, dtype=torch.int64,
                         device=bonus.device).view(1, -1)
    draft_tokens = (bonus * 7 + steps * 13) % 97 + 1
    confidence = 0.5 + ((bonus + steps) % 5).to(torch.float32) / 10.0
    return draft_tokens, confidence


def _verify_window(worker: DsparkWorker, batch: Any) -> list[tuple[int, int]]:
    """(row, committed length) of each request: the verify window is
    ``req_to_token[row, length : length + verify_tokens]`` (over-allocated by
    ``DFlashDraftInputV2.prepare_for_decode``)."""
    return list(zip(peek(batch.req_pool_indices), peek(batch.seq_lens), strict=True))


def _verify_accesses(out: Any, worker: DsparkWorker, batch: Any, draft_tokens: torch.Tensor
                     ) -> list[DeclaredAccess]:
    req_to_token = worker.req_to_token_pool.req_to_token
    kv = worker.target.kv_buffer
    acc = reads(draft_tokens) + reads(batch.spec_info.bonus_tokens)
    acc += reads(batch.req_pool_indices) + reads(batch.seq_lens)
    width = worker.config.verify_tokens
    for row, length in _verify_window(worker, batch):
        window = req_to_token[row, length:length + width]
        acc += reads(window) + writes(kv, rows=window)  # set_kv_buffer of the window
        prefix = req_to_token[row, :length]
        acc += reads(prefix) + reads(kv, rows=prefix)
    for tensor in out:
        acc += writes(tensor)
    return acc


@declared(_verify_accesses, name="dspark_target_verify_accept")
def _verify_and_accept(worker: DsparkWorker, batch: Any, draft_tokens: torch.Tensor
                       ) -> tuple[torch.Tensor, ...]:
    """The target verify of the window and the greedy accept: output tokens (one row of
    ``verify_tokens`` per request), commit lengths (1 to ``verify_tokens``), bonus tokens and
    the new committed lengths."""
    width = worker.config.verify_tokens
    # the window's KV written on the device, its slots gathered there too: a host read of
    # the rows and lengths would make the host wait for the stream, which SGLang's verify
    # does not (and on a GPU it would order the very sides a forced trial means to race)
    fill_slots(worker.target.kv_buffer, _window_slots(worker, batch, width), 1.0)
    bonus_in = batch.spec_info.bonus_tokens.to(torch.int64).view(-1, 1)
    anchor_and_drafts = torch.cat([bonus_in, draft_tokens], dim=1)
    out_tokens = (anchor_and_drafts * 3 + 1) % 97 + 1
    seq_lens = batch.seq_lens.to(torch.int64)
    commit_lens = ((seq_lens + bonus_in.view(-1)) % width + 1).to(torch.int32)
    bonus = out_tokens.gather(1, (commit_lens.to(torch.int64) - 1).view(-1, 1)).view(-1)
    new_seq_lens = seq_lens + commit_lens.to(torch.int64)
    return out_tokens, commit_lens, bonus, new_seq_lens


class DsparkWorker:
    """Stands where SGLang's ``DSparkWorkerV2`` stands (hosting the draft on this rank): its
    ``forward_batch_generation`` statements on the relay path, SGLang's verify planner, and
    the fields the scheduler reads."""

    def __init__(self, target: Any, config: Dspark, server_args: Any) -> None:
        import importlib

        planner = importlib.import_module(PLANNER_MODULE)
        self.target = target
        self.config = config
        self.req_to_token_pool = target.req_to_token_pool
        self.device = torch.device(DEVICE)
        self.verify_num_draft_tokens = config.verify_tokens
        # SGLang's own, as DSparkWorkerV2.__init__ builds it: a draft with a confidence head
        self._verify_planner = planner.DSparkVerifyPlanner(**_by_signature(
            planner.DSparkVerifyPlanner,
            draft_model=StrictStub("draft_model", confidence_head=StrictStub("confidence_head")),
            gamma=config.gamma, model_runner=target.model_runner, device=self.device,
            tp_rank=0, verify_num_draft_tokens=config.verify_tokens,
            tp_sync=StrictStub("tp_sync"), server_args=server_args))
        self._make_next_draft_input = importlib.import_module(DRAFT_MODULE).make_next_draft_input
        self.published_confidences: list[torch.Tensor] = []  # what each decode published
        self.budgets: list[int | None] = []  # each decode's budget from the relayed confidence

    # the fields the scheduler reads of a spec-v2 worker (BaseSpecWorker's and DSpark's)
    @property
    def target_worker(self) -> Any:
        return self.target

    @property
    def model_runner(self) -> Any:
        return self.target.model_runner

    @property
    def last_shared_read_runner(self) -> Any:
        """BaseSpecWorker's: the target runner (no graphs: it publishes no read-done event)."""
        return self.target.model_runner

    @property
    def war_fastpath_runner(self) -> Any:
        """:attr:`last_shared_read_runner` under the older name 0.5.17's WAR barrier reads."""
        return self.last_shared_read_runner

    @property
    def spec_v2_attn_backends(self) -> tuple[Any, ...]:
        """DSparkWorkerV2's: the target's and the draft's backends (one stand-in each)."""
        return (self.target.model_runner.attn_backend, self.target.model_runner.attn_backend)

    def on_verify_complete_cpu(self, num_correct_drafts_per_req: list[int],
                               batch_size: int = 0) -> None:
        """BaseSpecWorker's no-op (DSpark has no adaptive controller to feed)."""

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        """DSparkWorkerV2 tells its observers (block-accept estimator, info records), which
        are not driven: host bookkeeping only."""

    def get_confidence_budget_prepare(self) -> Any:
        """DSparkWorkerV2's body (a rank hosting the draft): the planner's hook."""
        return self._verify_planner.confidence_budget_prepare()

    def forward_batch_generation(self, batch: Any, on_publish: Any = None,
                                 grammar_barrier: Any = None, **kwargs: Any) -> Any:
        """DSparkWorkerV2's dispatch: a prefill (extend) or a decode step. The scheduler hands
        DSpark its grammar barrier (grammar overlap); the worker calls it only for a batch with
        grammars, which no DSpark variant has."""
        if kwargs or batch.has_grammar:
            raise TypeError("forward_batch_generation: unplanned arguments or grammar batch "
                            f"{sorted(kwargs)}")
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            self._verify_planner.note_non_decode_step()
            return self._forward_prefill(batch, on_publish)
        return self._forward_decode(batch, on_publish)

    def _forward_prefill(self, batch: Any, on_publish: Any) -> Any:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        output = self.target.forward_batch_generation(
            batch, capture_hidden_mode=CaptureHiddenMode.FULL)
        new_seq_lens = batch.seq_lens
        output.new_seq_lens = new_seq_lens
        if on_publish is not None:
            on_publish(new_seq_lens)
        output.logits_output.hidden_states = None  # injected into the draft KV (not driven)
        output.next_draft_input = self._make_next_draft_input(
            bonus_tokens=output.next_token_ids, new_seq_lens=new_seq_lens)
        return output

    def _forward_decode(self, batch: Any, on_publish: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult

        draft_input = batch.spec_info
        batch.seq_lens.record_stream(torch.cuda.current_stream())
        prefix_lens = batch.seq_lens
        draft_tokens, confidence = _propose(self, batch)
        budget = self._verify_planner.resolve_verify_token_budget(
            draft_input=draft_input, confidence=confidence, prefix_lens=prefix_lens,
            req_pool_indices=batch.req_pool_indices)
        self.budgets.append(budget)
        self.target.forwards += 1
        out_tokens, commit_lens, bonus, new_seq_lens = _verify_and_accept(
            self, batch, draft_tokens)
        if on_publish is not None:
            on_publish(new_seq_lens, confidence=confidence)
        self.published_confidences.append(confidence)
        next_draft_input = self._make_next_draft_input(bonus_tokens=bonus,
                                                       new_seq_lens=new_seq_lens)
        return GenerationBatchResult(
            logits_output=LogitsProcessorOutput(next_token_logits=None),
            next_token_ids=out_tokens.reshape(-1), accept_lens=commit_lens,
            can_run_cuda_graph=False, next_draft_input=next_draft_input,
            speculative_num_draft_tokens=self.config.verify_tokens, new_seq_lens=new_seq_lens)


def _by_signature(constructor: Any, **given: Any) -> dict[str, Any]:
    """The arguments of ``given`` that ``constructor`` takes, by name (releases differ: older
    planners take the server arguments, later ones the TP sync); a required parameter not in
    ``given`` is a changed constructor the driver does not know how to call."""
    import inspect

    taken = {}
    for name, parameter in inspect.signature(constructor).parameters.items():
        if name in given:
            taken[name] = given[name]
        elif parameter.default is inspect.Parameter.empty and parameter.kind not in (
                parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
            raise TypeError(f"{constructor.__qualname__} takes {name!r}, which the driver "
                            "does not know how to give (a changed constructor of the release)")
    return taken


def _window_slots(worker: DsparkWorker, batch: Any, width: int) -> torch.Tensor:
    """The verify window's KV slots, ``req_to_token[row, length : length + width]`` of each
    request, gathered on the device (the real verify reads them there: a host read of the
    rows and lengths would make the host wait for the stream, as SGLang's does not)."""
    req_to_token = worker.req_to_token_pool.req_to_token
    rows = batch.req_pool_indices.to(torch.int64).view(-1, 1)
    offsets = torch.arange(width, dtype=torch.int64, device=rows.device).view(1, -1)
    columns = batch.seq_lens.to(torch.int64).view(-1, 1) + offsets
    return req_to_token[rows, columns].reshape(-1).to(torch.int64)
