"""How many GPU clock cycles ``torch.cuda._sleep`` needs to spin for one microsecond.

``_sleep(cycles)`` busy-waits a kernel for a number of SM clock cycles, so the scenario costs
(microseconds) are reproduced by converting with a rate measured at start-up: time
``_sleep(N)`` with CUDA events for a few N and fit ``us = overhead + N / rate`` by least
squares (:func:`fit_cycles_per_us`, plain Python so it is tested without a GPU). The SM clock
rises under load, so :func:`calibrate` warms the GPU up first and takes the median of repeats.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from overlap_harness.model.errors import HarnessError

DEFAULT_POINTS = (20_000, 200_000, 1_000_000, 4_000_000)


class CalibrationError(HarnessError):
    """The sleep timings do not fit a positive rate (too few points, or a broken clock)."""


@dataclass(frozen=True, slots=True)
class Calibration:
    """The fitted rate and the per-sleep overhead, with the samples they came from."""

    cycles_per_us: float
    overhead_us: float
    samples: tuple[tuple[int, float], ...]

    def cycles(self, us: float) -> int:
        """Cycles that make ``_sleep`` last ``us`` microseconds (0 for no time)."""
        return cycles_for(us, self.cycles_per_us)


def fit_cycles_per_us(samples: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares fit of ``us = overhead + cycles / rate``; returns ``(rate, overhead)``.

    Raises:
        CalibrationError: fewer than two distinct cycle counts, or a non-positive slope.
    """
    xs = [float(c) for c, _ in samples]
    ys = [float(u) for _, u in samples]
    if len(set(xs)) < 2:
        raise CalibrationError(f"need two distinct cycle counts to fit a rate, got {xs}")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    if slope <= 0:
        raise CalibrationError(f"sleep time does not grow with cycles: samples {list(samples)}")
    return 1.0 / slope, my - slope * mx


def cycles_for(us: float, cycles_per_us: float) -> int:
    """Cycles for ``us`` microseconds at ``cycles_per_us`` (rounded; never negative)."""
    if us < 0:
        raise ValueError(f"negative duration {us} us")
    return round(us * cycles_per_us)


def time_sleep_us(cycles: int, stream: torch.cuda.Stream | None = None) -> float:
    """Run ``_sleep(cycles)`` between two CUDA events and return the measured microseconds."""
    s = stream or torch.cuda.current_stream()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(s):
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0


def calibrate(points: Sequence[int] = DEFAULT_POINTS, repeats: int = 3,
              warmup_cycles: int = 20_000_000) -> Calibration:
    """Measure ``_sleep`` on the current CUDA device and fit the rate (see module docstring)."""
    torch.cuda.synchronize()
    time_sleep_us(warmup_cycles)  # let the SM clock rise before measuring
    samples = []
    for n in points:
        samples.append((n, statistics.median(time_sleep_us(n) for _ in range(repeats))))
    rate, overhead = fit_cycles_per_us(samples)
    return Calibration(rate, overhead, tuple(samples))
