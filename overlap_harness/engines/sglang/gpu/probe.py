"""Did a forced trial make the race's order? Measured at the race's two sides, on the device.

A necessary row whose forced trials all equal the serial answer has two possible reasons
(issue 36): the race was made but the value it corrupts is overwritten (or never read) before
it reaches the compared buffers, or the race needs a timing the delay cannot make. A probe
tells them apart in one more trial: after each device op issued on the delayed stream from the
race's *earlier* side (a frame at the CPU race's ``file:line``), a CUDA event is recorded on
that stream; each time the *later* side's line calls anything (``sys.setprofile``: Python and
C calls, so a host ``tolist()`` counts), the last such event is queried. Pending: the later
side ran before the earlier one finished, the race's order was made. Done: something between
them waited for it (a host read of a device value, another stream's wait), so no delay of the
earlier side can reorder them.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch


def short_path(path: str) -> str:
    """A file as every machine names it: ``overlap_harness/...``, SGLang's ``sglang/...``
    tail, or an installed package's path below ``site-packages/`` (``torch/cuda/...``); the
    checkout's or the venv's prefix differs from machine to machine."""
    path = path.replace("\\", "/")
    if "site-packages/" in path:
        return path[path.rindex("site-packages/") + len("site-packages/"):]
    for anchor in ("overlap_harness/", "sglang/"):
        if anchor in path:
            return path[path.index(anchor):]
    return path


_ABSOLUTE_SOURCE = re.compile(r"(?<![\w.])/[^\s:'\"()]+\.py\b")


def without_machine_paths(text: str) -> str:
    """``text`` (a crash's message) with each absolute ``.py`` path in its short form."""
    return _ABSOLUTE_SOURCE.sub(lambda match: short_path(match.group()), text)


def _key(location: str) -> tuple[str, int]:
    """``'.../overlap_harness/engines/sglang/w.py:313'`` -> (``'overlap_harness/.../w.py'``,
    313); a SGLang path keeps its ``sglang/...`` tail (the checkout's prefix differs)."""
    path, _, line = location.rpartition(":")
    return short_path(path), int(line)


def _matches(frame: FrameType, keys: Sequence[tuple[str, int]]) -> bool:
    """The frame is at one of ``keys``: its file ends with the path, and the line is the
    frame's line or within the lines of the instruction it runs (a call spread over several
    lines is reported at any of them)."""
    name = frame.f_code.co_filename.replace("\\", "/")
    for path, line in keys:
        if not name.endswith(path):
            continue
        if frame.f_lineno == line:
            return True
        positions = list(frame.f_code.co_positions())
        index = frame.f_lasti // 2
        if 0 <= index < len(positions):
            start, end = positions[index][0], positions[index][1]
            if start is not None and end is not None and start <= line <= end:
                return True
    return False


#: calls that can order the host or a stream behind earlier device work: what ran between the
#: two sides when the later one found the earlier one finished (named in ``orderings``)
ORDERING_CALLS = frozenset({
    "synchronize", "wait_stream", "wait_event", "wait", "item", "tolist", "cpu", "numpy",
    "query", "record_stream", "_local_scalar_dense", "is_nonzero", "nonzero", "to", "copy_"})
#: a host-side earlier side (a host write, an allocator free) is delayed by this many seconds
#: per GPU clock cycle asked (about 1.5 GHz: the order of a Hopper SM clock)
HOST_SECONDS_PER_CYCLE = 1 / 1.5e9


@dataclass
class SideProbe:
    """The two sides of the CPU races whose earlier side is on ``stream`` (``file:line``;
    ``stream`` ``host``: a host action)."""

    stream: str
    earlier: tuple[str, ...]
    later: tuple[str, ...]
    earlier_issued: int = 0
    later_pending: int = 0  # the later side reached while the earlier side's work was pending
    later_done: int = 0  # ... after it had finished
    later_first: int = 0  # ... before any earlier side was issued
    host_cycles: int = 0  # a host earlier side: the delay before each of its calls
    host_sleeps: int = 0
    orderings: dict[str, int] = field(default_factory=dict)  # see ORDERING_CALLS
    #: the shortest host time (seconds) from the earlier side's last op to a reach of the
    #: later side that found it finished: a delay must outlast it to make the race there
    least_done_gap_s: float | None = None
    #: reaches of the later side that found even the first earlier-side op issued since the
    #: previous reach pending (every earlier op of that stretch: the one whose memory the later
    #: side touches among them), and the shortest host time from that first op to a reach
    #: that found it finished: a delay of each earlier op must outlast it so that whichever
    #: op the later side conflicts with is still pending
    later_all_pending: int = 0
    least_first_done_gap_s: float | None = None
    on_made: Any = field(default=None, repr=False)  # called once, when the race is first made
    _event: Any = field(default=None, repr=False)
    _earlier_at: float = field(default=0.0, repr=False)
    _first: Any = field(default=None, repr=False)  # (event, host time) of the stretch's first
    _since_earlier: list[str] = field(default_factory=list, repr=False)
    _earlier_keys: list[tuple[str, int]] = field(default_factory=list, repr=False)
    _later_keys: list[tuple[str, int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._earlier_keys = [_key(x) for x in self.earlier]
        self._later_keys = [_key(x) for x in self.later]

    def counts(self) -> dict[str, Any]:
        """What the trial showed (kept in the trial's details)."""
        out: dict[str, Any] = {
            "earlier_issued": self.earlier_issued, "later_pending": self.later_pending,
            "later_done": self.later_done, "later_first": self.later_first}
        if self.host_sleeps:
            out["host_sleeps"] = self.host_sleeps
        if self.least_done_gap_s is not None:
            out["least_done_gap_s"] = round(self.least_done_gap_s, 6)
        if self.later_all_pending:
            out["later_all_pending"] = self.later_all_pending
        if self.least_first_done_gap_s is not None:
            out["least_first_done_gap_s"] = round(self.least_first_done_gap_s, 6)
        out["orderings"] = dict(sorted(self.orderings.items(), key=lambda kv: -kv[1])[:6])
        return out

    def made(self) -> bool:
        """The trial made the race's order: the later side ran while the earlier side's
        work was still pending."""
        return self.later_pending > 0

    def _at(self, frame: FrameType | None, keys: Sequence[tuple[str, int]]) -> bool:
        while frame is not None:
            if _matches(frame, keys):
                return True
            frame = frame.f_back
        return False

    def at_earlier(self, depth: int = 2) -> bool:
        """The op being issued (``depth`` frames up from the caller) comes from the race's
        earlier side: the targeted forcing delays exactly these ops."""
        return self._at(sys._getframe(depth), self._earlier_keys)

    def after_op(self, at_earlier: bool) -> None:
        """Called by the forcing mode after a device op issued on the delayed stream (its
        ``at_earlier`` from :meth:`at_earlier`)."""
        if at_earlier:
            self.earlier_issued += 1
            self._event = torch.cuda.Event()
            self._event.record()
            self._earlier_at = time.perf_counter()
            self._since_earlier.clear()
            if self._first is None:
                self._first = (self._event, self._earlier_at)

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_code.co_name
            frame = frame.f_back  # a Python call: the caller's line
        elif event == "c_call":
            name = getattr(arg, "__name__", "")
        else:
            return
        if frame is None:
            return
        if self.host_cycles and _matches(frame, self._earlier_keys):
            time.sleep(self.host_cycles * HOST_SECONDS_PER_CYCLE)  # a host earlier side held
            self.host_sleeps += 1
            self.earlier_issued += 1
            return
        if not _matches(frame, self._later_keys):
            if self._event is not None and name in ORDERING_CALLS \
                    and len(self._since_earlier) < 32:
                self._since_earlier.append(f"{name} at {_short(frame)}")
            return
        self._first_of_stretch()
        if self._event is None:
            self.later_first += 1
        elif self._event.query():
            self.later_done += 1
            self.least_done_gap_s = _least(self.least_done_gap_s,
                                           time.perf_counter() - self._earlier_at)
            for call in dict.fromkeys(self._since_earlier):
                self.orderings[call] = self.orderings.get(call, 0) + 1
        else:
            self.later_pending += 1
            if self.later_pending == 1 and self.on_made is not None:
                self.on_made()  # a trial that then dies (a CUDA abort) still made the race

    def _first_of_stretch(self) -> None:
        """At a reach of the later side: was the first earlier op since the previous reach
        still pending (``later_all_pending``), or how long after it was the side reached
        (``least_first_done_gap_s``)? A new stretch begins."""
        if self._first is None:
            return
        event, issued_at = self._first
        self._first = None
        if not event.query():
            self.later_all_pending += 1
            return
        self.least_first_done_gap_s = _least(self.least_first_done_gap_s,
                                             time.perf_counter() - issued_at)

    @contextmanager
    def watching(self) -> Iterator[None]:
        """The later side's calls watched while the trial runs."""
        previous = sys.getprofile()
        sys.setprofile(self._profile)
        try:
            yield
        finally:
            sys.setprofile(previous)


def _least(shortest: float | None, gap: float) -> float:
    """The shorter of a probe's shortest gap so far (None: none yet) and ``gap``."""
    return gap if shortest is None else min(shortest, gap)


def _short(frame: FrameType) -> str:
    """``sglang/srt/x.py:12`` or ``overlap_harness/...:3`` for a frame (no machine prefix)."""
    path, line = _key(f"{frame.f_code.co_filename.replace(chr(92), '/')}:{frame.f_lineno}")
    return f"{path}:{line}"


def probes(race_examples: Sequence[str], stream: str) -> SideProbe:
    """The probe of the races (loop report's ``race_examples``) whose earlier side is on
    ``stream``: ``'RAW x: op on self.S at a.py:1 / op on host at b.py:2'``."""
    earlier: list[str] = []
    later: list[str] = []
    for example in race_examples:
        _, _, sides = example.partition(": ")
        first, _, second = sides.partition(" / ")
        agent, _, where = first.rpartition(" at ")
        if agent.rsplit(" on ", 1)[-1].removeprefix("self.") != stream:
            continue
        earlier.append(where.strip())
        later.append(second.rpartition(" at ")[2].strip())
    return SideProbe(stream, tuple(dict.fromkeys(earlier)), tuple(dict.fromkeys(later)))


def why_equal(probe_counts: dict[str, Any], probe: dict[str, Any]) -> tuple[str, str]:
    """(reason key, text) for a necessary row whose probed trial equals the serial answer:
    ``overwritten`` when the race's order was made, ``timing`` when it was not."""
    sides = f"earlier side {', '.join(probe['earlier'])} on {probe['stream']}; later side " \
            f"{', '.join(probe['later'])}"
    c = probe_counts
    reached = c["later_pending"] + c["later_done"] + c["later_first"]
    if c["later_pending"]:
        return "overwritten", (
            f"the race was made ({c['later_pending']} of {reached} reaches of the later side "
            f"ran while the earlier side's work was still pending on the device; {sides}), "
            "yet output_ids and req_to_token equal the serial answer: the value it corrupts "
            "is overwritten or not read before it reaches them")
    if not c["earlier_issued"]:
        return "timing", (f"no device op of the earlier side was issued on the delayed stream "
                          f"in the probed trial ({sides}): the delay has nothing to hold")
    if not reached:
        return "timing", f"the later side was not reached in the probed trial ({sides})"
    seen = c.get("orderings")
    between = "" if seen is None else (  # None: a probe older than the orderings' count
        "; calls that can order them ran between the sides: "
        + ", ".join(f"{call} ({times}x)" for call, times in seen.items()) if seen
        else "; no call that can order them ran between the sides on the host")
    gap = c.get("least_done_gap_s")
    host_gap = "" if gap is None else (
        f"; the host reached the later side at least {gap * 1e3:.1f} ms after the earlier "
        "side's op")
    return "timing", (
        f"the earlier side had finished each of the {c['later_done']} times the later side "
        f"was reached ({c['later_first']} reaches came before any earlier side; {sides})"
        f"{between}{host_gap}: something between them waits for it, or the delay was "
        "shorter than the host's own time between the sides")
