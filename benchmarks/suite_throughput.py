"""Scenarios per second for the default suite, and exploration schedules per second.

    python benchmarks/suite_throughput.py

Prints a table; record it in docs/benchmarks.md. One process, one core.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from overlap_harness.explore import Trial, explore  # noqa: E402
from overlap_harness.runner import run_scenarios, simulate  # noqa: E402
from overlap_harness.scenarios.expand import expand  # noqa: E402
from overlap_harness.scenarios.loader import load_paths, load_scenario  # noqa: E402


def main() -> None:
    scenarios = load_paths([ROOT / "scenarios"])
    run_scenarios(scenarios[:1])  # warm-up: first-use costs out of the timed region
    t0 = time.perf_counter()
    results = run_scenarios(scenarios)
    suite_s = time.perf_counter() - t0
    long_run = load_scenario(ROOT / "scenarios/variants/long_run_16_iterations.toml")
    spec = next(s for s in expand(long_run) if s.removed)
    n = 0

    def trial(delays, jitter, seed) -> Trial:
        nonlocal n
        n += 1
        _, dev = simulate(spec.scenario, spec.removed, delays=delays, jitter=jitter, seed=seed)
        run = dev.finish()
        return Trial(run.races, False)  # never manifest: the whole budget is spent

    t0 = time.perf_counter()
    explore(trial, budget=40)
    ex_s = time.perf_counter() - t0
    print("| measure | value |")
    print("|---|---|")
    print(f"| scenarios in the default suite | {len(scenarios)} |")
    print(f"| runs (base + mutations), each with its serial oracle | {len(results)} |")
    print(f"| suite wall time (s) | {suite_s:.1f} |")
    print(f"| scenarios/s | {len(scenarios) / suite_s:.2f} |")
    print(f"| runs/s (run + oracle) | {len(results) / suite_s:.2f} |")
    print(f"| exploration schedules/s (16-iteration scenario) | {n / ex_s:.2f} |")


if __name__ == "__main__":
    main()
