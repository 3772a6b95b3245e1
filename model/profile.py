"""Device profiles: measured costs of one GPU, and the costs the simulator takes from them.

A profile is a JSON file written by ``overlap-harness calibrate`` on a GPU (the measuring code
is :mod:`gpu_check.profiling`). It holds where it was measured (device, driver, torch, CUDA,
Python, date, command) and every figure with its spread (:class:`Figure`: median, 10th and
90th percentile, sample count), in two groups that are kept apart on purpose:

- ``system``: what the system being modelled pays, measured on raw ``torch.cuda`` calls in
  tight loops: the host issue cost of each op kind (:data:`ISSUE_KINDS`), kernel and copy
  durations by size (:data:`SIZE_SERIES`), and the GPU gap between a host sync returning and
  the next kernel starting. ``run``, ``whatif`` and ``report`` with ``--profile`` use these.
- ``harness``: what the harness's own replay adds: the host cost of each device-API call of
  ``CudaDevice`` (Python, recording, staging; :data:`HARNESS_KINDS`) and the extra GPU time
  an op takes beyond its modelled cost. Only predicting a ``gpu-check`` replay uses these.

:func:`costs_from_profile` is the pure function from a profile to :class:`ProfileCosts`:
a :class:`model.config.Timing` plus per-op-kind host costs and per-kind extra durations,
which ``sim.profiled.ProfiledSimDevice`` charges. Nothing here touches a GPU or the disk
except :func:`load_profile` and :func:`dump_profile`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from overlap_harness.model.config import Timing
from overlap_harness.model.errors import HarnessError

FORMAT = "overlap-harness-profile/1"

#: Host issue costs of the system, one per op kind the protocol issues (raw torch.cuda).
ISSUE_KINDS = (
    "kernel_launch", "h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable",
    "event_record", "wait_event", "wait_stream", "query", "synchronize", "record_stream",
)
#: Host costs of the harness's device API, by the timeline's op kinds (model.trace.OpKind)
#: plus ``sync_return`` (host time from a sync's end to the next call) and ``sync_span`` (the
#: blocked span of a host sync whose work was already done: the sync's own cost).
HARNESS_KINDS = (
    "kernel", "copy", "record", "wait", "query", "host_sync", "host_read", "host_write",
    "alloc", "free", "host_work", "sync_return", "sync_span",
)
#: GPU duration series measured by size (bytes): one per protocol op kind and copy direction.
SIZE_SERIES = ("fill", "gather", "scatter", "h2d_pinned", "d2h_pinned", "d2d")
#: The size (bytes) at which a Timing's small-op costs are read off the series.
SMALL_OP_BYTES = 4096
META_KEYS = ("device", "driver", "torch", "cuda", "python", "date", "command")


class Mode(StrEnum):
    """Which costs :func:`costs_from_profile` returns."""

    SYSTEM = "system"  # the system alone: what run / whatif / report predict
    REPLAY = "replay"  # the harness's CudaDevice replay: what gpu-check measures


class ProfileError(HarnessError):
    """A profile file is unreadable or invalid; the message is one line (file, key, reason)."""


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured quantity in microseconds: median, 10th/90th percentile, sample count."""

    median: float
    p10: float
    p90: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Figure:
        """The figure of raw samples (at least one).

        Raises:
            ValueError: no samples.
        """
        if not samples:
            raise ValueError("a figure needs at least one sample")
        xs = sorted(float(x) for x in samples)
        return cls(statistics.median(xs), _quantile(xs, 0.1), _quantile(xs, 0.9), len(xs))


def _quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted ``xs``."""
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class SizePoint:
    """A duration measured at one size."""

    bytes: int
    us: Figure


@dataclass(frozen=True, slots=True)
class SizeFit:
    """``us = base_us + per_kib_us * bytes / 1024``, least squares over a size series."""

    base_us: float
    per_kib_us: float

    def at(self, nbytes: int) -> float:
        """The fitted duration at ``nbytes`` (never negative)."""
        return max(0.0, self.base_us + self.per_kib_us * nbytes / 1024)


def fit_sizes(points: Sequence[SizePoint]) -> SizeFit:
    """Least-squares line through the medians; one point gives a flat line.

    Raises:
        ValueError: no points.
    """
    if not points:
        raise ValueError("a size fit needs at least one point")
    xs = [p.bytes / 1024 for p in points]
    ys = [p.us.median for p in points]
    if len(set(xs)) < 2:
        return SizeFit(statistics.fmean(ys), 0.0)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) \
        / sum((x - mx) ** 2 for x in xs)
    return SizeFit(my - slope * mx, slope)


#: Host time keys of the timing group (``model.op_list.cost_key``), each optional.
TIMING_CALL_KEYS = ("kernel", "copy_h2d", "copy_d2h", "copy_d2d", "record", "wait_event",
                    "wait_stream", "query", "host_read", "host_write", "record_stream",
                    "host_work")
#: Single figures of the timing group (µs; ``kernel_extra``, ``start_gap`` and ``start_lag``
#: may be negative: a ``_sleep`` can end early, a kernel can start before its call returns);
#: ``wait_gap`` (the start gap stands in), ``sync_return`` and ``copy_return`` (0) are optional.
TIMING_FIGURES = ("kernel_extra", "sync_idle", "sync_wake", "start_gap", "start_lag",
                  "wait_gap", "sync_return", "copy_return")


@dataclass(frozen=True, slots=True)
class TimingGroup:
    """What the timing replay (``gpu_check.timing_replay``) pays on this device: raw
    torch.cuda calls issued from a prebuilt list, read off replays of the calibration
    workloads (``model.op_list.timing_costs``).

    Args:
        call_us: host time of each call kind (:data:`TIMING_CALL_KEYS`; host work: beyond
            its cost).
        figures: :data:`TIMING_FIGURES`: a kernel's GPU time beyond its ``_sleep`` cost, the
            span of a host sync with nothing to wait for, the host's wake-up after one that
            waited, the GPU gap between an op and the queued op after it on its stream, the
            GPU start of an op on an idle stream after its call returned.
        kernel_extra_by_op_us: ``kernel_extra`` by ``kernel:NAME``.
        copy_us: a copy's GPU time by direction (``h2d``, ``d2h``, ``d2d``).
        fitted_on: what it was fitted on (workloads, replays).
        mean_us: the mean of each ``call_us`` key and of ``sync_wake``, ``start_gap`` and
            ``wait_gap``: these are summed over a run (host time, waits, GPU gaps), and the
            expected sum of skewed samples is their mean, not their median; the simulator
            charges the mean where there is one.
        gap_by_op_us: the mean start (or wait) gap by ``kind:NAME`` of a kernel or copy
            (recorded, not charged: the transition's gap carries to ops the calibration
            never ran, and predicted the H100 suite better).
        gap_by_transition_us: the mean start gap by transition (``"kernel->copy"``: the
            kinds of the previous op on the stream and of this one).
    """

    call_us: dict[str, Figure]
    figures: dict[str, Figure]
    kernel_extra_by_op_us: dict[str, Figure]
    copy_us: dict[str, Figure]
    fitted_on: str
    mean_us: dict[str, float] = field(default_factory=dict)
    gap_by_op_us: dict[str, float] = field(default_factory=dict)
    gap_by_transition_us: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Profile:
    """A whole profile file (see the module docstring for the two groups)."""

    meta: dict[str, str]
    sleep_cycles_per_us: float
    system_issue_us: dict[str, Figure]
    sync_to_launch_us: Figure
    durations: dict[str, tuple[SizePoint, ...]]
    harness_issue_us: dict[str, Figure]
    harness_extra_us: dict[str, Figure]
    harness_issue_by_op_us: dict[str, Figure] = field(default_factory=dict)
    harness_extra_by_op_us: dict[str, Figure] = field(default_factory=dict)
    notes: tuple[str, ...] = field(default=())
    timing: TimingGroup | None = None

    @property
    def device(self) -> str:
        """The device's name as torch reports it."""
        return self.meta["device"]


@dataclass(frozen=True, slots=True)
class ProfileCosts:
    """What the simulator charges under a profile (all microseconds).

    Args:
        timing: the scenario's Timing with the device-dependent costs replaced.
        host_issue_us: host cost before each call, by ``sim.profiled`` call kind
            (:data:`SIM_KINDS`).
        extra_duration_us: GPU time an op takes beyond its modelled cost, by ``kernel`` and
            ``copy``.
        sync_return_us: host time after a host sync returns before the next call.
        mode: which group of the profile these came from.
        sync_span_us: the shortest a host sync blocks, its work done or not.
        op_issue_us / op_extra_us: the same by ``kind:name`` of a kernel or copy, where the
            profile measured that op; they override the kind's figure.
        copy_us: a copy's whole GPU time by direction (``h2d``, ``d2h``, ``d2d``), replacing
            its modelled cost (the timing group: real copies of the buffers' size).
        sync_wake_us: host time from the end of the work a sync waited for to its return.
        start_gap_us: GPU time before each kernel or copy starts, after its issue or its
            stream's previous op (charged as a start delay).
        wait_gap_us: the same for the first kernel or copy after a wait on its stream.
        copy_return_us: ``sync_return_us`` for a blocking copy (None: the same).
        gap_by_transition_us: the start gap by transition (``"kernel->copy"``), for an op
            without its own gap that does not follow a wait.
    """

    timing: Timing
    host_issue_us: dict[str, float]
    extra_duration_us: dict[str, float]
    sync_return_us: float
    mode: Mode
    op_issue_us: dict[str, float] = field(default_factory=dict)
    op_extra_us: dict[str, float] = field(default_factory=dict)
    sync_span_us: float = 0.0
    copy_us: dict[str, float] = field(default_factory=dict)
    sync_wake_us: float = 0.0
    start_gap_us: float = 0.0
    wait_gap_us: float = 0.0
    copy_return_us: float | None = None
    gap_by_transition_us: dict[str, float] = field(default_factory=dict)


#: The call kinds ``sim.profiled.ProfiledSimDevice`` charges a host cost for.
SIM_KINDS = ("kernel", "copy_h2d", "copy_d2h", "copy_d2d", "record", "wait_event",
             "wait_stream", "query", "synchronize", "host_read", "host_write", "alloc", "free",
             "record_stream", "host_work")


# -- reading and writing ----------------------------------------------------------------------

def _figure(raw: Any, key: str, problems: list[str], signed: bool = False) -> Figure | None:
    if not isinstance(raw, Mapping):
        problems.append(f"{key}: expected a table with median, p10, p90, n, got {raw!r}")
        return None
    missing = [k for k in ("median", "p10", "p90", "n") if k not in raw]
    if missing:
        problems.append(f"{key}: missing {', '.join(missing)}")
        return None
    vals = {}
    for k in ("median", "p10", "p90"):
        v = raw[k]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or (v < 0 and not signed):
            problems.append(f"{key}.{k}: expected a finite number{'' if signed else ' >= 0'}, "
                            f"got {v!r}")
            return None
        vals[k] = float(v)
    n = raw["n"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        problems.append(f"{key}.n: expected an integer >= 1, got {n!r}")
        return None
    if not vals["p10"] <= vals["median"] <= vals["p90"]:
        problems.append(f"{key}: expected p10 <= median <= p90, got {vals['p10']:g}, "
                        f"{vals['median']:g}, {vals['p90']:g}")
        return None
    return Figure(vals["median"], vals["p10"], vals["p90"], n)


def _figures(raw: Any, key: str, kinds: Sequence[str], problems: list[str]) -> dict[str, Figure]:
    if not isinstance(raw, Mapping):
        problems.append(f"{key}: expected a table keyed by {'|'.join(kinds)}")
        return {}
    out = {}
    for k in kinds:
        if k not in raw:
            problems.append(f"{key}.{k}: missing (every one of {'|'.join(kinds)} is needed)")
            continue
        if (f := _figure(raw[k], f"{key}.{k}", problems)) is not None:
            out[k] = f
    for k in raw:
        if k not in kinds:
            problems.append(f"{key}.{k}: unknown kind; expected one of {'|'.join(kinds)}")
    return out


def profile_from_dict(doc: Any, source: str = "<profile>") -> Profile:
    """Validate a parsed profile document.

    Raises:
        ProfileError: one line, ``source: key: reason`` for the first problem and how many
            more there are.
    """
    problems: list[str] = []
    if not isinstance(doc, Mapping):
        raise ProfileError(f"{source}: expected a JSON object at the top")
    if doc.get("format") != FORMAT:
        problems.append(f"format: expected {FORMAT!r}, got {doc.get('format')!r}")
    meta = {}
    for k in META_KEYS:
        v = doc.get(k)
        if not isinstance(v, str) or not v:
            problems.append(f"{k}: expected a non-empty string, got {v!r}")
        else:
            meta[k] = v
    rate = doc.get("sleep_cycles_per_us")
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
        problems.append(f"sleep_cycles_per_us: expected a number > 0, got {rate!r}")
    system = doc.get("system") if isinstance(doc.get("system"), Mapping) else {}
    harness = doc.get("harness") if isinstance(doc.get("harness"), Mapping) else {}
    for name, part in (("system", doc.get("system")), ("harness", doc.get("harness"))):
        if not isinstance(part, Mapping):
            problems.append(f"{name}: expected a table")
    issue = _figures(system.get("issue_us"), "system.issue_us", ISSUE_KINDS, problems)
    gap = _figure(system.get("sync_to_launch_us"), "system.sync_to_launch_us", problems)
    durations = _series(system.get("durations"), problems)
    h_issue = _figures(harness.get("issue_us"), "harness.issue_us", HARNESS_KINDS, problems)
    h_extra = _figures(harness.get("extra_us"), "harness.extra_us", ("kernel", "copy"),
                       problems)
    by_op = {}
    for name in ("issue_by_op_us", "extra_by_op_us"):
        raw = harness.get(name, {})
        if not isinstance(raw, Mapping):
            problems.append(f"harness.{name}: expected a table keyed by kind:name")
            raw = {}
        by_op[name] = {k: f for k, v in raw.items()
                       if (f := _figure(v, f"harness.{name}.{k}", problems)) is not None}
    timing = _timing_group(doc.get("timing"), problems) if "timing" in doc else None
    notes = doc.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(x, str) for x in notes):
        problems.append("notes: expected a list of strings")
        notes = []
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ProfileError(f"{source}: {problems[0]}{more}")
    assert gap is not None
    return Profile(meta, float(rate), issue, gap, durations, h_issue, h_extra,
                   by_op["issue_by_op_us"], by_op["extra_by_op_us"], tuple(notes), timing)


def _figure_table(raw: Any, key: str, problems: list[str], keys: Sequence[str] | None = None,
                  signed: bool = False) -> dict[str, Figure]:
    """A table of figures; with ``keys``, only those keys (each optional)."""
    if not isinstance(raw, Mapping):
        problems.append(f"{key}: expected a table of figures")
        return {}
    out = {}
    for k, v in raw.items():
        if keys is not None and k not in keys:
            problems.append(f"{key}.{k}: unknown key; expected one of {'|'.join(keys)}")
        elif (f := _figure(v, f"{key}.{k}", problems, signed)) is not None:
            out[k] = f
    return out


def _timing_group(raw: Any, problems: list[str]) -> TimingGroup | None:
    if not isinstance(raw, Mapping):
        problems.append("timing: expected a table")
        return None
    figures = _figure_table(raw.get("figures"), "timing.figures", problems, TIMING_FIGURES,
                            signed=True)
    missing = [k for k in TIMING_FIGURES[:5] if k not in figures]
    if missing and isinstance(raw.get("figures"), Mapping):
        problems.append(f"timing.figures: missing {', '.join(missing)}")
    fitted = raw.get("fitted_on")
    if not isinstance(fitted, str):
        problems.append(f"timing.fitted_on: expected a string, got {fitted!r}")
    return TimingGroup(
        _figure_table(raw.get("call_us"), "timing.call_us", problems, TIMING_CALL_KEYS),
        figures,
        _figure_table(raw.get("kernel_extra_by_op_us", {}), "timing.kernel_extra_by_op_us",
                      problems, signed=True),
        _figure_table(raw.get("copy_us"), "timing.copy_us", problems, ("h2d", "d2h", "d2d")),
        str(fitted), _means(raw.get("mean_us", {}), problems),
        _numbers(raw.get("gap_by_op_us", {}), "timing.gap_by_op_us", problems),
        _numbers(raw.get("gap_by_transition_us", {}), "timing.gap_by_transition_us", problems))


def _numbers(raw: Any, key: str, problems: list[str]) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        problems.append(f"{key}: expected a table of numbers")
        return {}
    out = {}
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            problems.append(f"{key}.{k}: expected a finite number, got {v!r}")
        else:
            out[str(k)] = float(v)
    return out


def _means(raw: Any, problems: list[str]) -> dict[str, float]:
    keys = (*TIMING_CALL_KEYS, "sync_wake", "start_gap", "wait_gap", "sync_return",
            "copy_return")
    if not isinstance(raw, Mapping):
        problems.append("timing.mean_us: expected a table of numbers")
        return {}
    out = {}
    for k, v in raw.items():
        if k not in keys:
            problems.append(f"timing.mean_us.{k}: unknown key; expected one of {'|'.join(keys)}")
        elif isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            problems.append(f"timing.mean_us.{k}: expected a finite number, got {v!r}")
        else:
            out[k] = float(v)
    return out


def _series(raw: Any, problems: list[str]) -> dict[str, tuple[SizePoint, ...]]:
    key = "system.durations"
    if not isinstance(raw, Mapping):
        problems.append(f"{key}: expected a table keyed by {'|'.join(SIZE_SERIES)}")
        return {}
    out = {}
    for name in SIZE_SERIES:
        pts = raw.get(name)
        if not isinstance(pts, list) or not pts:
            problems.append(f"{key}.{name}: expected a non-empty list of {{bytes, us}}")
            continue
        got = []
        for i, p in enumerate(pts):
            where = f"{key}.{name}[{i}]"
            b = p.get("bytes") if isinstance(p, Mapping) else None
            if isinstance(b, bool) or not isinstance(b, int) or b < 0:
                problems.append(f"{where}.bytes: expected an integer >= 0, got {b!r}")
                continue
            if (f := _figure(p.get("us"), f"{where}.us", problems)) is not None:
                got.append(SizePoint(b, f))
        out[name] = tuple(got)
    for name in raw:
        if name not in SIZE_SERIES:
            problems.append(f"{key}.{name}: unknown series; expected one of "
                            f"{'|'.join(SIZE_SERIES)}")
    return out


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file.

    Raises:
        ProfileError: the file cannot be read, is not JSON, or is invalid (one line).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{p}: cannot read the profile: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{p}: not JSON: {exc.msg} at line {exc.lineno}") from None
    return profile_from_dict(doc, str(p))


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """The JSON document of a profile (:func:`profile_from_dict` reads it back)."""
    def figs(d: Mapping[str, Figure]) -> dict[str, Any]:
        return {k: dataclasses.asdict(v) for k, v in d.items()}

    return {
        "format": FORMAT, **profile.meta, "sleep_cycles_per_us": profile.sleep_cycles_per_us,
        "system": {
            "issue_us": figs(profile.system_issue_us),
            "sync_to_launch_us": dataclasses.asdict(profile.sync_to_launch_us),
            "durations": {k: [{"bytes": p.bytes, "us": dataclasses.asdict(p.us)} for p in v]
                          for k, v in profile.durations.items()},
        },
        "harness": {"issue_us": figs(profile.harness_issue_us),
                    "extra_us": figs(profile.harness_extra_us),
                    "issue_by_op_us": figs(profile.harness_issue_by_op_us),
                    "extra_by_op_us": figs(profile.harness_extra_by_op_us)},
        "notes": list(profile.notes),
    } | ({} if profile.timing is None else {"timing": {
        "fitted_on": profile.timing.fitted_on,
        "call_us": figs(profile.timing.call_us),
        "figures": figs(profile.timing.figures),
        "kernel_extra_by_op_us": figs(profile.timing.kernel_extra_by_op_us),
        "copy_us": figs(profile.timing.copy_us),
        "mean_us": dict(profile.timing.mean_us),
        "gap_by_op_us": dict(profile.timing.gap_by_op_us),
        "gap_by_transition_us": dict(profile.timing.gap_by_transition_us)}})


def dump_profile(profile: Profile, path: str | Path) -> None:
    """Write a profile as indented JSON."""
    Path(path).write_text(json.dumps(profile_to_dict(profile), indent=1) + "\n",
                          encoding="utf-8")


# -- profile -> simulator costs ---------------------------------------------------------------

DEFAULT_TIMING = Timing()


def costs_from_profile(profile: Profile, base: Timing = DEFAULT_TIMING,
                       mode: Mode = Mode.SYSTEM) -> ProfileCosts:
    """The costs the simulator charges under ``profile`` (pure).

    ``SYSTEM``: host issue costs are the raw torch.cuda figures (a sync's own cost, measured
    on an idle stream, is its shortest blocked span); ``host_launch`` becomes the
    kernel launch cost, ``schedule_kernel`` the small gather kernel's duration and ``d2h`` the
    small pinned D2H copy's (at :data:`SMALL_OP_BYTES`); the workload's own costs
    (``schedule_prep``, ``process_results``, ``forward``, ``verify_share``) stay the
    scenario's: they describe the model served, not the device. No extra durations.

    ``REPLAY``: what a ``CudaDevice`` replay of the scenario costs: the harness's measured
    host cost per call kind, and its extra GPU time per op on top of the scenario's costs,
    which the replay reproduces with ``_sleep`` (so the Timing's durations stay).
    """
    s = {k: f.median for k, f in profile.system_issue_us.items()}
    if mode == Mode.SYSTEM and profile.timing is not None:
        return _timing_costs(profile.timing, base)
    if mode == Mode.SYSTEM:
        issue = {
            "kernel": s["kernel_launch"], "copy_h2d": s["h2d_pinned"],
            "copy_d2h": s["d2h_pinned"], "copy_d2d": s["kernel_launch"],
            "record": s["event_record"], "wait_event": s["wait_event"],
            "wait_stream": s["wait_stream"], "query": s["query"],
            "synchronize": 0.0, "host_read": 0.0, "host_write": 0.0,
            "alloc": 0.0, "free": 0.0, "record_stream": s["record_stream"], "host_work": 0.0,
        }
        small = {k: fit_sizes(v).at(SMALL_OP_BYTES) for k, v in profile.durations.items()}
        timing = dataclasses.replace(base, host_launch=s["kernel_launch"],
                                     schedule_kernel=small["gather"], d2h=small["d2h_pinned"])
        return ProfileCosts(timing, issue, {"kernel": 0.0, "copy": 0.0},
                            profile.sync_to_launch_us.median, mode,
                            sync_span_us=s["synchronize"])
    h = {k: f.median for k, f in profile.harness_issue_us.items()}
    issue = {
        "kernel": h["kernel"], "copy_h2d": h["copy"], "copy_d2h": h["copy"],
        "copy_d2d": h["copy"], "record": h["record"], "wait_event": h["wait"],
        "wait_stream": h["record"] + h["wait"], "query": h["query"],
        "synchronize": h["host_sync"], "host_read": h["host_read"],
        "host_write": h["host_write"], "alloc": h["alloc"], "free": h["free"],
        "record_stream": 0.0, "host_work": h["host_work"],
    }
    timing = dataclasses.replace(base, host_launch=h["kernel"])
    extra = {k: f.median for k, f in profile.harness_extra_us.items()}
    return ProfileCosts(timing, issue, extra, h["sync_return"], mode,
                        {k: f.median for k, f in profile.harness_issue_by_op_us.items()},
                        {k: f.median for k, f in profile.harness_extra_by_op_us.items()},
                        h["sync_span"])


def _timing_costs(group: TimingGroup, base: Timing) -> ProfileCosts:
    """SYSTEM costs from a timing group: what the timing replay pays (raw torch.cuda calls
    from a prebuilt list). The scenario's kernel and host-work costs stay (the replay runs
    kernels as ``_sleep`` of their cost and host work as busy time); ``host_launch`` becomes
    the kernel call's mean and ``d2h`` the measured D2H copy (what the plain simulator of
    ``run`` / ``whatif`` / ``report --profile`` takes); ProfiledSimDevice charges the rest
    per call kind."""
    call = {k: group.mean_us.get(k, f.median) for k, f in group.call_us.items()}
    fig = {k: group.mean_us.get(k, f.median) for k, f in group.figures.items()}
    issue = {kind: call.get(key, 0.0) for kind, key in (
        ("kernel", "kernel"), ("copy_h2d", "copy_h2d"), ("copy_d2h", "copy_d2h"),
        ("copy_d2d", "copy_d2d"), ("record", "record"), ("wait_event", "wait_event"),
        ("wait_stream", "wait_stream"), ("query", "query"), ("host_read", "host_read"),
        ("host_write", "host_write"), ("record_stream", "record_stream"),
        ("host_work", "host_work"))}
    issue |= {"synchronize": 0.0, "alloc": 0.0, "free": 0.0}
    copy = {k: f.median for k, f in group.copy_us.items()}
    timing = dataclasses.replace(base, host_launch=issue["kernel"],
                                 d2h=copy.get("d2h", base.d2h))
    return ProfileCosts(timing, issue, {"kernel": fig["kernel_extra"], "copy": 0.0},
                        fig.get("sync_return", 0.0),
                        Mode.SYSTEM, {},
                        {k: f.median for k, f in group.kernel_extra_by_op_us.items()},
                        fig["sync_idle"], {k: f.median for k, f in group.copy_us.items()},
                        fig["sync_wake"], fig["start_gap"],
                        fig.get("wait_gap", fig["start_gap"]),
                        fig.get("copy_return", fig.get("sync_return", 0.0)),
                        dict(group.gap_by_transition_us))
