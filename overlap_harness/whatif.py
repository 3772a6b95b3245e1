"""What-if: the protocol variants side by side on one workload, metrics and race verdict.

Each variant is the scenario's protocol with a few keys overridden; all run on the same
workload and cost model in one process, so the rows compare as ratios. The variants are the
ones SGLang's history argued about (PROTOCOL.md §2, §8):

- ``verify_done``: seq_lens synced by the legacy verify_done wait (before #25879, so
  with no WAR barrier), beside ``publish_ready_no_barrier`` (#25879 itself);
- ``d2h_on_schedule``: the seq_lens D2H as a blocking ``.cpu()`` on S under the barrier;
- ``publish_after_draft_extend``: publish_ready recorded after draft-extend;
- ``read_done``: the read-done event barrier (#28363) instead of the loop-top wait_stream;
- ``after_launch``: the barrier right after each launch (#31687);
- ``no_barrier``: no WAR barrier at all;
- every other ``war_barrier`` choice under its own name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from overlap_harness.model.config import Scenario, WarBarrier
from overlap_harness.model.errors import HarnessError
from overlap_harness.model.metrics import Metrics, compute_metrics
from overlap_harness.runner import canonical_races, simulate

VARIANTS: dict[str, dict[str, Any]] = {
    "ref": {},
    "verify_done": {"seq_lens_sync": "verify_done", "war_barrier": "none"},
    "publish_ready_no_barrier": {"war_barrier": "none"},
    "d2h_on_schedule": {"seq_lens_d2h": "schedule_stream"},
    "publish_after_draft_extend": {"publish_point": "after_draft_extend"},
    "read_done": {"war_barrier": "read_done"},
    "after_launch": {"war_barrier": "after_launch"},
    "no_barrier": {"war_barrier": "none"},
}
# every other WAR-barrier placement (model/protocol/barrier.py) under its own name, so a new
# placement is compared here with no edit (after_replay_prepare, the worked example)
VARIANTS.update({choice.value: {"war_barrier": choice.value} for choice in WarBarrier
                 if choice not in (WarBarrier.LOOP_TOP, WarBarrier.NONE)
                 and choice.value not in VARIANTS})


@dataclass(frozen=True, slots=True)
class WhatIfRow:
    """One variant's figures on the shared workload."""

    variant: str
    overrides: dict[str, Any]
    metrics: Metrics | None
    races: tuple[str, ...]
    error: str | None = None


def _apply(sc: Scenario, overrides: dict[str, Any]) -> Scenario:
    p = sc.protocol
    typed = {}
    for k, v in overrides.items():
        cur = getattr(p, k)
        typed[k] = type(cur)(v)
    return dataclasses.replace(sc, protocol=dataclasses.replace(p, **typed))


def whatif(
    sc: Scenario,
    variants: dict[str, dict[str, Any]] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    watch: Callable[[int, int, int], None] | None = None,
) -> list[WhatIfRow]:
    """Run every variant of ``sc`` (default: :data:`VARIANTS`) and return one row each.

    ``progress(i, n, variant)`` is told as each variant starts (and ``(n, n, "")`` at the
    end); ``watch(iteration, iterations, ops)`` as each iteration of a variant starts."""
    rows = []
    chosen = variants or VARIANTS
    total = sc.workload.iterations

    def on_iteration(n: int, ops: int) -> None:
        if watch is not None:
            watch(min(n, total), total, ops)

    for i, (name, ov) in enumerate(chosen.items()):
        if progress is not None:
            progress(i, len(chosen), name)
        try:
            variant = _apply(sc, ov)
            _, dev = simulate(variant, watch=on_iteration if watch else None)
            run = dev.finish()
            run.races = canonical_races(variant, (), run)  # the verdict: issue-order values
        except HarnessError as exc:
            rows.append(WhatIfRow(name, ov, None, (), str(exc)))
            continue
        keys = tuple(sorted({r.key for r in run.races}))
        rows.append(WhatIfRow(name, ov, compute_metrics(run.timeline), keys))
    if progress is not None:
        progress(len(chosen), len(chosen), "")
    return rows


def format_rows(rows: list[WhatIfRow]) -> list[list[str]]:
    """Table cells: variant, iteration, host stall, resolve stall, forward idle, overlap,
    verdict."""
    out = []
    for r in rows:
        if r.metrics is None:
            out.append([r.variant, "-", "-", "-", "-", "-", f"error: {r.error}"])
            continue
        m = r.metrics
        verdict = "race: " + ", ".join(r.races) if r.races else "race-free"
        out.append([r.variant, f"{m.iteration_ns / 1000:.0f}", f"{m.host_stall_ns / 1000:.0f}",
                    f"{m.resolve_stall_ns / 1000:.0f}", f"{m.forward_idle_ns / 1000:.0f}",
                    f"{m.overlap_ratio:.2f}", verdict])
    return out


HEAD = ["variant", "iteration us", "host stall us", "resolve stall us", "fwd idle us",
        "overlap", "verdict"]
