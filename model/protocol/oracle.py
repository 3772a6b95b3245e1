"""Holding an overlapped run against the serial oracle, value by value (ARCHITECTURE.md).

A race-free program computes the same values under every timing, so any difference between an
overlapped run and the serial run (``SimDevice(serial=True)``) is a manifest race: a crash-free
wrong answer. :func:`compare_runs` reports, per request, iteration and key, the first wrong
value and what the oracle had.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from overlap_harness.model.protocol.outcome import ProtocolOutcome

Observations = Mapping[tuple[str, int], list[torch.Tensor]]


@dataclass(frozen=True, slots=True)
class ValueDiff:
    """One value that differs from the oracle's.

    Args:
        key: what differs: ``"tokens"``, ``"skipped_at"``, ``"seq_lens_cpu"``, ``"accept_lens"``,
            ``"debug_failures"``, ``"batch"``, or an observed op's key (``"gather_seq_lens"``).
        iteration: the scheduler iteration (-1 for whole-run values such as tokens).
        request: the request it concerns, where known.
        index: position in the value (token index, or flat element of the observation).
        got: the overlapped run's value (None: missing).
        expected: the oracle's value (None: missing).
    """

    key: str
    iteration: int
    request: str | None
    index: int
    got: Any
    expected: Any

    def describe(self) -> str:
        """One line for reports."""
        who = f" request {self.request}" if self.request else ""
        return (f"{self.key} iteration {self.iteration}{who} [{self.index}]: got {self.got!r}, "
                f"oracle had {self.expected!r}")


def _first_list_diff(got: list, exp: list) -> tuple[int, Any, Any] | None:
    for i in range(max(len(got), len(exp))):
        g = got[i] if i < len(got) else None
        e = exp[i] if i < len(exp) else None
        if g != e:
            return i, g, e
    return None


def _outcome_diffs(got: ProtocolOutcome, exp: ProtocolOutcome) -> list[ValueDiff]:
    out: list[ValueDiff] = []
    for n in sorted(set(got.batches) | set(exp.batches)):
        d = _first_list_diff(got.batches.get(n, []), exp.batches.get(n, []))
        if d:
            out.append(ValueDiff("batch", n, None, *d))
    for rid in sorted(set(got.requests) | set(exp.requests)):
        g, e = got.requests.get(rid), exp.requests.get(rid)
        if g is None or e is None:
            out.append(ValueDiff("request", -1, rid, 0, g is not None, e is not None))
            continue
        for key in ("tokens", "skipped_at"):
            d = _first_list_diff(getattr(g, key), getattr(e, key))
            if d:
                out.append(ValueDiff(key, -1, rid, *d))
        for key in ("seq_lens_cpu", "accept_lens"):
            gv, ev = getattr(g, key), getattr(e, key)
            for n in sorted(set(gv) | set(ev)):
                if gv.get(n) != ev.get(n):
                    out.append(ValueDiff(key, n, rid, 0, gv.get(n), ev.get(n)))
                    break
    gf = [(f.iteration, f.request, f.check) for f in got.debug_failures]
    ef = [(f.iteration, f.request, f.check) for f in exp.debug_failures]
    d = _first_list_diff(gf, ef)
    if d:
        out.append(ValueDiff("debug_failures", -1, None, *d))
    return out


def _obs_diffs(
    got: Observations, exp: Observations, batches: dict[int, list[str]]
) -> list[ValueDiff]:
    out: list[ValueDiff] = []
    for key, n in sorted(set(got) | set(exp), key=lambda k: (k[1], k[0])):
        gl, el = got.get((key, n)), exp.get((key, n))
        if gl is None or el is None:
            out.append(ValueDiff(key, n, None, 0, gl is not None, el is not None))
            continue
        gflat = [t.reshape(-1) for t in gl]
        eflat = [t.reshape(-1) for t in el]
        base = 0
        for gi, (gt, et, graw) in enumerate(zip(gflat, eflat, gl, strict=False)):
            if gt.shape != et.shape or not torch.equal(gt, et):
                if gt.shape != et.shape:
                    out.append(ValueDiff(key, n, None, base, tuple(gt.shape), tuple(et.shape)))
                    break
                j = int((gt != et).nonzero()[0, 0])
                ids = batches.get(n, [])
                req = None
                if graw.dim() >= 1 and graw.shape[0] == len(ids) and ids:
                    req = ids[j // max(1, gt.numel() // len(ids))]
                out.append(ValueDiff(f"{key}[{gi}]", n, req, j, gt[j].item(), et[j].item()))
                break
            base += gt.numel()
        if len(gl) != len(el):
            out.append(ValueDiff(key, n, None, -1, len(gl), len(el)))
    return out


def compare_runs(
    overlapped_outcome: ProtocolOutcome,
    overlapped_observations: Observations,
    oracle_outcome: ProtocolOutcome,
    oracle_observations: Observations,
) -> list[ValueDiff]:
    """Every first difference between an overlapped run and the serial oracle.

    Outcome values (batches, tokens, seq_lens_cpu, accept lens, debug failures) first, then
    the observed reads: per (key, iteration), the first differing element of each read, with
    the request it belongs to when the read has one row per request. An empty list means the
    overlapped run computed exactly the oracle's values.
    """
    diffs = _outcome_diffs(overlapped_outcome, oracle_outcome)
    diffs += _obs_diffs(overlapped_observations, oracle_observations, oracle_outcome.batches)
    return diffs
