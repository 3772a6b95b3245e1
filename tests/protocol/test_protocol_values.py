"""Values of the protocol model: variants race-free and equal to the oracle, debug checks
firing where the protocol bug is a logic bug (no race), configuration errors up front."""

from __future__ import annotations

import dataclasses as dc
import json

import pytest

from overlap_harness.model.config import EventKind as EK
from overlap_harness.model.config import (
    FutureLayout,
    Gather,
    Mode,
    Platform,
    ProtocolConfig,
    PublishPoint,
    Request,
    SeqLensD2H,
    StashStream,
    Timing,
    WarBarrier,
    Workload,
    WorkloadEvent,
)
from overlap_harness.model.errors import HarnessError
from overlap_harness.model.protocol import StreamAliasError, run_protocol
from overlap_harness.sim.sim_device import SimDevice
from tests.dsl import run_with_oracle

BASE = ProtocolConfig(gather=Gather.UNFUSED, debug_poison=True)
R = Request
MIXED = Workload(
    iterations=12,
    requests=(R("A", 0, 10, 30), R("B", 0, 6, 5), R("C", 2, 20, 6, chunks=3), R("D", 5, 4, 30)),
    events=(WorkloadEvent(4, EK.RETRACT, "A"), WorkloadEvent(8, EK.IDLE)),
)


def run_pair(proto: ProtocolConfig, wl: Workload):
    """Overlapped and serial runs: (outcome, diffs vs oracle, races)."""
    p = run_with_oracle(proto, wl)
    return p.outcome, p.diffs, p.races


VARIANTS = {
    "rows": {},
    "nonspec": {"mode": Mode.NON_SPEC},
    "topk2": {"topk": 2, "num_steps": 2, "num_draft_tokens": 4},
    "no_hidden": {"hidden_states": False},
    "schedule_stream_d2h": {"seq_lens_d2h": SeqLensD2H.SCHEDULE_STREAM},
    "opt_out_d2h": {"seq_lens_d2h": SeqLensD2H.NONE},
    "after_draft_extend": {"publish_point": PublishPoint.AFTER_DRAFT_EXTEND},
    "after_launch": {"war_barrier": WarBarrier.AFTER_LAUNCH, "swa": True},
    "hip_forced_barrier": {"platform": Platform.HIP, "force_barrier": True},
    "plan_stream": {"plan_stream": True},
    "delayed_sampling": {"mode": Mode.NON_SPEC, "delayed_sampling": True},
    "side_stash": {"stash_stream": StashStream.SIDE},
    "side_stash_nonspec": {"stash_stream": StashStream.SIDE, "mode": Mode.NON_SPEC},
}


@pytest.mark.parametrize("over", list(VARIANTS.values()), ids=list(VARIANTS))
def test_variant_is_race_free_and_equals_oracle(over) -> None:
    out, diffs, races = run_pair(dc.replace(BASE, **over), MIXED)
    assert races == [], "\n".join(r.describe() for r in races[:3])
    assert diffs == []
    assert out.debug_failures == []
    assert out.batch_kinds[8] == "idle" and out.batches[8] == []
    assert out.requests["A"].retracted_at == [4]
    assert all(out.requests[r].tokens for r in "ABCD")


def test_spec_outcome_records_host_seq_lens_and_accepts() -> None:
    out, _, _ = run_pair(BASE, MIXED)
    b = out.requests["B"]
    assert len(b.tokens) == 5 and b.finished_at is not None
    decode_its = sorted(b.accept_lens)
    assert decode_its and all(1 <= b.accept_lens[n] <= BASE.num_draft_tokens for n in decode_its)
    lens = [b.seq_lens_cpu[n] for n in sorted(b.seq_lens_cpu)]
    assert lens[0] == 6 and lens == sorted(lens)  # prompt length first, then growing
    json.dumps(out.to_dict())


def test_opted_out_backend_has_no_cpu_seq_lens() -> None:
    out, _, _ = run_pair(dc.replace(BASE, seq_lens_d2h=SeqLensD2H.NONE), MIXED)
    assert all(v is None for r in out.requests.values() for v in r.seq_lens_cpu.values())


def test_delayed_stash_after_gather_fires_poison_assert() -> None:
    """§9.24: the gather of n+1 runs before the stash of n: it reads the -1 poison."""
    proto = dc.replace(BASE, mode=Mode.NON_SPEC, delayed_sampling=True)
    wl = Workload(iterations=6, requests=(R("A", 0, 6, 20), R("B", 0, 4, 20)))
    bad, _, _ = run_pair(dc.replace(proto, delayed_stash_after_gather=True), wl)
    assert bad.failures("poison_assert")
    good, _, _ = run_pair(proto, wl)
    assert good.failures() == []


def test_ring_layout_overflows_with_chunked_prefill() -> None:
    """§9.19 / #13713: the old ring hands a slot to a chunk before its reader gathers it."""
    wl = Workload(iterations=9, requests=(R("A", 0, 6, 12), R("B", 0, 6, 12),
                                         R("C", 2, 20, 4, chunks=3)))
    ring = dc.replace(BASE, future_layout=FutureLayout.RING, ring_size=3)
    out, _, races = run_pair(ring, wl)
    assert out.failures("ring_alias") and races == []
    rows, _, _ = run_pair(BASE, wl)
    assert rows.failures() == []
    assert rows.requests["A"].tokens != out.requests["A"].tokens


def test_one_x_over_allocation_runs_past_the_row() -> None:
    """§9.11: alloc_factor 1 does not cover the one-verify lag (no stream bug involved)."""
    wl = Workload(iterations=6, requests=(R("A", 0, 10, 40),))
    out, diffs, races = run_pair(dc.replace(BASE, alloc_factor=1), wl)
    assert out.failures("alloc_overrun") and races == [] and diffs == []


def test_skip_publish_reads_previous_owner_seq_lens() -> None:
    """§9.21: B's publish skipped: its seq_lens are the row's previous owner's."""
    wl = Workload(iterations=8, requests=(R("A", 0, 10, 4), R("B", 4, 6, 5)),
                  events=(WorkloadEvent(4, EK.SKIP_PUBLISH, "B"),))
    out, _, _ = run_pair(BASE, wl)
    good, _, _ = run_pair(BASE, dc.replace(wl, events=()))
    first = min(out.requests["B"].seq_lens_cpu)
    assert good.requests["B"].seq_lens_cpu[first] == 6
    assert out.requests["B"].seq_lens_cpu[first] != 6


def test_stream_aliasing_is_rejected() -> None:
    with pytest.raises(StreamAliasError, match="S must differ from the forward stream F"):
        run_protocol(SimDevice(), (dc.replace(BASE, alias_schedule_forward=True),
                                   MIXED, Timing()))


def test_triton_gather_off_cuda_is_rejected_up_front() -> None:
    with pytest.raises(HarnessError, match="triton"):
        run_protocol(SimDevice(), (dc.replace(BASE, gather=Gather.TRITON), MIXED, Timing()))
