"""SGLang's FutureMap relay written by a replayed CUDA graph: DSpark's in-graph scatter.

With ``SGLANG_OPT_DSV41_DSPARK_POST_FOLD`` SGLang 0.5.23's DSpark static verify graph scatters
each step's new sequence lengths and bonus tokens straight into the FutureMap's relay
buffers, and the host-side ``publish``/``stash`` skip their own scatter for the very tensors
the graph already scattered. This module runs that path, not the DSpark loop, under
``recorder.watch(mode="cpu")`` (CUDA faked; the recorder keeps a capture as a template and
re-issues it at each replay).

SGLang's own code, unmodified:

* ``DsparkVerifyEpilogue._scatter_future_relay`` (speculative/dspark_components/
  dspark_verify.py), on a bare epilogue made with ``__new__``: it builds
  ``FutureRelayBuffers`` and offers them (``offer_future_relay_buffers``) at the warm-up,
  before capture (its own assert), and is captured into the graph with the accept;
* ``FutureMap`` (managers/overlap_utils.py), built after the capture, which adopts the
  offered relay (``_adopt_relay``), and its ``publish``, ``stash``, ``resolve_seq_lens_cpu``
  (the ``publish_ready`` event, the private D2H stream and its wait) and
  ``resolve_forward_inputs``/``_resolve_spec_extras``;
* ``make_next_draft_input`` (dspark_draft.py), ``RelayPayload.from_draft_input``,
  ``SpeculativeAlgorithm.DSPARK`` and ``spec_need_hidden_states`` under a DSPARK spec config.

The harness's (what the DSpark worker does around them, kept to the statements this path
needs): the epilogue's four fields (:class:`StrictStub` commit context whose one method
names the pool), the accept inside the graph (plain tensor ops writing ``new_seq_lens_buf``
and ``bonus_buf`` from the static inputs: ``seq_lens + accept_len`` and a stand-in bonus),
the copies into the static inputs before each replay, the worker's two statements that mark
what the graph scattered (dspark_worker_v2.py ``relay.published_seq_lens = ...`` and
``relay.published_bonus = ...``), and the loop order of scheduler.py's ``run_batch``
(resolve on the schedule stream, forward stream waits it, publish mid-forward, stash after,
the WAR barrier as a full ``wait_stream`` of the forward stream).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

import overlap_harness.recorder as recorder
from overlap_harness.engines.core.mutation import Site, removed, site
from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.sglang import environment, scheduler_build
from overlap_harness.model.trace import Race

OVERLAP_UTILS = "sglang.srt.managers.overlap_utils"
VERIFY_MODULE = "sglang.srt.speculative.dspark_components.dspark_verify"
DRAFT_MODULE = "sglang.srt.speculative.dspark_components.dspark_draft"

DEVICE = torch.device("cuda", 0)  # faked on the CPU by recorder.watch(mode="cpu")
POOL_SIZE = 8
MAX_CONTEXT = 64
ROWS = (1, 2)  # the requests' pool rows; the graph is captured for this batch size
ACCEPT_LENS = ((2, 1), (3, 3), (1, 2))  # accepted tokens per row at each replayed step
PROMPT_LEN = 3
CAPTURED_AT = "(captured at "  # how the recorder names a replayed graph's op

#: the FutureMap's own sync statements on the relay path, by name: (method, line text)
SYNC_SITES: dict[str, tuple[str, str]] = {
    "d2h_wait_event": ("resolve_seq_lens_cpu",
                       "self.fwd_prepare_d2h_stream.wait_event(self.publish_ready)"),
    "publish_ready_record": ("publish", "self.publish_ready.record()"),
}


@dataclass
class RelayOutcome:
    """One run: the detector's races, what the loop read back, and how the relay was used."""

    races: list[Race]
    seq_lens_seen: list[list[int]]  # the host mirror's lengths each decode step resolved
    bonus_seen: list[list[int]]  # the bonus tokens each decode step gathered
    scatters_skipped: int  # publish/stash calls that found their tensor already scattered
    adopted: bool  # the FutureMap adopted the relay the graph writes
    hidden_states_relayed: bool  # the FutureMap relays hidden states (DSpark's does not)
    unknown_ops: list[str]  # ops that touched device memory with undeclared accesses

    def race_pairs(self) -> list[tuple[str, str]]:
        """(first, second) of each race as ``file:line`` (file name only); an access of a
        replayed graph is named by the line it was captured at."""
        pairs = []
        for race in self.races:
            sides = []
            for access in (race.first, race.second):
                source = access.source
                if CAPTURED_AT in access.op_name:
                    source = access.op_name.rsplit(CAPTURED_AT, 1)[1].rstrip(")")
                sides.append(source.rsplit("/", 1)[-1])
            pairs.append((sides[0], sides[1]))
        return pairs


def load() -> dict[str, Any]:
    """Import SGLang's modules on this path (raises ``SglangTreeError`` when it cannot).

    Meant for a process that has not imported SGLang another way: the conformance run's
    ``spec_utils`` stub, imported first, would answer ``spec_need_hidden_states`` for EAGLE."""
    environment.load()
    return {name: importlib.import_module(module) for name, module in
            (("ou", OVERLAP_UTILS), ("verify", VERIFY_MODULE), ("draft", DRAFT_MODULE))}


def sync_site(name: str) -> Site:
    """The FutureMap statement :data:`SYNC_SITES` names, found in SGLang's source."""
    method, text = SYNC_SITES[name]
    return site(importlib.import_module(OVERLAP_UTILS).FutureMap, method, text)


class _Pool:
    """The ReqToTokenPool fields FutureMap reads (``req_to_token``; kept by its confidence
    relay, never used on this path)."""

    def __init__(self) -> None:
        self.req_to_token = torch.zeros((POOL_SIZE, MAX_CONTEXT), dtype=torch.int32,
                                        device=DEVICE)


class RelayLoop:
    """The relay path, step by step, inside a running CPU-mode watch."""

    def __init__(self, modules: dict[str, Any]) -> None:
        self.ou, self.verify, self.draft = modules["ou"], modules["verify"], modules["draft"]
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # deferred: optional

        self.algo = SpeculativeAlgorithm.DSPARK
        self.schedule_stream = torch.cuda.Stream()
        self.forward_stream = torch.cuda.Stream()
        torch.cuda.set_stream(self.schedule_stream)
        self.pool = _Pool()
        bs = len(ROWS)
        self.static_rows = torch.zeros((bs,), dtype=torch.int64, device=DEVICE)
        self.static_seq_lens = torch.zeros((bs,), dtype=torch.int64, device=DEVICE)
        self.static_accept = torch.zeros((bs,), dtype=torch.int64, device=DEVICE)
        self.static_bonus_in = torch.zeros((bs,), dtype=torch.int64, device=DEVICE)
        self.epilogue = self._bare_epilogue(bs)
        self.graph = self._warm_up_and_capture()
        self.fm = self.ou.FutureMap(DEVICE, self.algo, self.pool, needs_cpu_seq_lens=True)
        self.skipped = 0
        self.seq_lens_seen: list[list[int]] = []
        self.bonus_gathered: list[torch.Tensor] = []  # fresh gather outputs, read at the end
        self.draft_input: Any = None

    def _bare_epilogue(self, bs: int) -> Any:
        """A DsparkVerifyEpilogue with only the fields ``_scatter_future_relay`` reads."""
        epilogue = self.verify.DsparkVerifyEpilogue.__new__(self.verify.DsparkVerifyEpilogue)
        pool = self.pool
        epilogue.commit_ctx = StrictStub("commit_ctx",
                                         resolve_req_to_token=lambda: pool.req_to_token)
        epilogue.future_relay = None
        epilogue.new_seq_lens_buf = torch.zeros((bs,), dtype=torch.int64, device=DEVICE)
        epilogue.bonus_buf = torch.zeros((bs,), dtype=torch.int64, device=DEVICE)
        return epilogue

    def _verify_body(self) -> None:
        """The static verify's accept (stand-in) and SGLang's in-graph relay scatter."""
        bs = len(ROWS)
        epilogue = self.epilogue
        epilogue.new_seq_lens_buf.copy_(self.static_seq_lens + self.static_accept)
        epilogue.bonus_buf.copy_((self.static_bonus_in * 7 + self.static_accept) % 1000)
        epilogue._scatter_future_relay(self.static_rows, bs)  # SGLang's, unmodified

    def _warm_up_and_capture(self) -> Any:
        """Warm-up on the forward stream (the relay is built and offered here), then the
        capture on torch's capture stream, as the verify graph runner captures."""
        with torch.cuda.stream(self.forward_stream):
            self.forward_stream.wait_stream(self.schedule_stream)  # the static buffers' zeros
            self._verify_body()
        torch.cuda.synchronize()
        verify_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(verify_graph):
            self._verify_body()
        return verify_graph

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        self._prefill()
        for accept in ACCEPT_LENS:
            self._decode_step(accept)

    def _batch(self) -> Any:
        """The ScheduleBatch fields overlap_utils reads on this path (schedule stream)."""
        req_pool_indices = _pinned(ROWS).to(DEVICE, non_blocking=True)
        fields: dict[str, Any] = {
            "prefill_input_ids_cpu": None, "input_ids": None, "enable_overlap": True,
            "spec_algorithm": self.algo, "req_pool_indices": req_pool_indices,
            "req_pool_indices_cpu": torch.tensor(ROWS, dtype=torch.int64),
            "seq_lens": None, "seq_lens_cpu": None, "seq_lens_sum": None,
            "spec_info": self.draft_input}
        if self.draft_input is not None:
            self.draft_input.future_indices = req_pool_indices
        return StrictStub("batch", **fields)

    def _prefill(self) -> None:
        """The prefill relays through the host scatter (no graph): publish and stash."""
        batch = self._batch()
        with torch.cuda.stream(self.forward_stream):
            self.forward_stream.wait_stream(self.schedule_stream)
            fi = batch.req_pool_indices
            lens = torch.full((len(ROWS),), PROMPT_LEN + 1, dtype=torch.int64, device=DEVICE)
            tokens = torch.arange(len(ROWS), dtype=torch.int64, device=DEVICE) + 11
            self.fm.publish(fi, lens)
            self._stash(fi, tokens, lens)
        self.schedule_stream.wait_stream(self.forward_stream)  # _apply_war_barrier

    def _decode_step(self, accept: tuple[int, ...]) -> None:
        batch = self._batch()
        self.fm.resolve_seq_lens_cpu(batch)  # run_batch, schedule stream
        self.seq_lens_seen.append(batch.seq_lens_cpu.tolist())
        with torch.cuda.stream(self.forward_stream):
            self.forward_stream.wait_stream(self.schedule_stream)
            self.ou.resolve_forward_inputs(batch, self.fm)
            fi = batch.req_pool_indices
            self.bonus_gathered.append(batch.spec_info.bonus_tokens)
            self.static_rows.copy_(fi)
            self.static_seq_lens.copy_(batch.seq_lens)
            self.static_bonus_in.copy_(batch.spec_info.bonus_tokens)
            self.static_accept.copy_(_pinned(accept), non_blocking=True)
            self.graph.replay()
            bs = len(ROWS)
            new_seq_lens = self.epilogue.new_seq_lens_buf[:bs]  # read_accept's views
            bonus = self.epilogue.bonus_buf[:bs]
            relay = self.epilogue.future_relay
            relay.published_seq_lens = new_seq_lens  # dspark_worker_v2.py, before on_publish
            self.fm.publish(fi, new_seq_lens)  # on_publish
            self.skipped += int(relay.published_seq_lens is None)
            self._stash(fi, bonus, new_seq_lens, relay)
        self.schedule_stream.wait_stream(self.forward_stream)  # _apply_war_barrier

    def _stash(self, fi: torch.Tensor, bonus: torch.Tensor, new_seq_lens: torch.Tensor,
               relay: Any = None) -> None:
        """make_next_draft_input and _relay_forward_payload's stash (forward stream)."""
        self.draft_input = self.draft.make_next_draft_input(bonus_tokens=bonus,
                                                            new_seq_lens=new_seq_lens)
        if relay is not None:
            relay.published_bonus = self.draft_input.bonus_tokens  # dspark_worker_v2.py
        self.fm.stash(fi, self.ou.RelayPayload.from_draft_input(self.draft_input))
        if relay is not None:
            self.skipped += int(relay.published_bonus is None)

    def bonus_seen(self) -> list[list[int]]:
        """The bonus tokens each decode step gathered, read once the device is idle (after
        the loop, so the host reads order nothing in it)."""
        torch.cuda.synchronize()
        return [tensor.tolist() for tensor in self.bonus_gathered]


def _pinned(values: tuple[int, ...]) -> torch.Tensor:
    """Host staging in pinned memory, as SGLang stages its batch copies on CUDA (a pageable
    source would make the copy wait for its stream, which hides races)."""
    return torch.tensor(values, dtype=torch.int64).pin_memory()


@contextmanager
def _dspark_config() -> Iterator[None]:
    """SGLang's spec config says DSPARK for the block (spec_need_hidden_states reads it):
    a plain ``ServerArgs`` published as the scheduler's, its spec bag overridden."""
    from sglang.srt.runtime_context import get_spec  # deferred: optional

    scheduler_build.server_args(scheduler_build.base_server_options())
    with get_spec().override(speculative_algorithm="DSPARK"):
        yield


def run(mutation: str | None = None) -> RelayOutcome:
    """Run the relay path (with the :data:`SYNC_SITES` statement ``mutation`` removed)."""
    modules = load()
    ou = modules["ou"]
    offered = ou._offered_relay
    cut = removed(sync_site(mutation)) if mutation is not None else nullcontext()
    try:
        with (recorder.watch(mode="cpu") as watch, environment.cuda_selected(),
              _dspark_config(), cut):
            loop = RelayLoop(modules)
            loop.run()
            outcome = RelayOutcome([], loop.seq_lens_seen, loop.bonus_seen(), loop.skipped,
                                   loop.epilogue.future_relay.adopted,
                                   loop.fm.need_hidden_states, [])
            del loop
    finally:
        ou._offered_relay = offered  # the module-wide offer must not reach a later FutureMap
    outcome.races = list(watch.races)
    outcome.unknown_ops = [f"{op.name} at {op.site}" for op in watch.unknown_ops]
    return outcome


def sglang_lines() -> dict[str, str]:
    """``file:line`` of the SGLang statements the races are judged at."""
    ou, verify = importlib.import_module(OVERLAP_UTILS), importlib.import_module(VERIFY_MODULE)
    found = {
        "publish_scatter": site(ou.FutureMap, "publish",
                                "self.new_seq_lens_buf[indices] = new_seq_lens"),
        "d2h_copy": site(ou.FutureMap, "resolve_seq_lens_cpu",
                         "self.new_seq_lens_cpu_pinned.copy_("),
        "graph_scatter": site(verify.DsparkVerifyEpilogue, "_scatter_future_relay",
                              "self.future_relay.new_seq_lens[rows] ="),
    }
    return {key: f"{value.file.rsplit('/', 1)[-1]}:{value.line}" for key, value in found.items()}


def summary() -> dict[str, Any]:
    """The intact run and one run per :data:`SYNC_SITES` mutation, as JSON-ready data."""
    runs = {}
    for mutation in (None, *SYNC_SITES):
        outcome = run(mutation)
        runs[mutation or "intact"] = {
            "race_pairs": outcome.race_pairs(), "seq_lens_seen": outcome.seq_lens_seen,
            "bonus_seen": outcome.bonus_seen, "scatters_skipped": outcome.scatters_skipped,
            "adopted": outcome.adopted, "hidden_states_relayed": outcome.hidden_states_relayed,
            "unknown_ops": outcome.unknown_ops}
    return {"runs": runs, "lines": sglang_lines()}


if __name__ == "__main__":
    import json
    import sys

    try:
        load()
    except environment.SglangTreeError as exc:
        print(f"relay_replay: {exc}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(summary()))
