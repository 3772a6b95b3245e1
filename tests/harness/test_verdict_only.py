"""``run_spec(..., oracle=False)`` (the SGLang loop report's model column): the serial oracle
is skipped, and with it only the value differences; the verdict, races, faults and labels
reached equal those of the full run, spec by spec, on bundled scenarios with racy and
race-free mutations. Every verdict is the simulator's."""

from __future__ import annotations

from pathlib import Path

from overlap_harness.runner import run_spec
from overlap_harness.scenarios.expand import expand
from overlap_harness.scenarios.loader import load_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios" / "protocol"


def test_without_the_oracle_only_the_value_differences_go() -> None:
    verdicts = []
    for name in ("s02_schedule_waits_publish.toml", "s03_d2h_waits_publish.toml"):
        for spec in expand(load_scenario(SCENARIOS / name)):
            full, quick = run_spec(spec), run_spec(spec, oracle=False)
            assert (quick.verdict, quick.ok, quick.error, quick.faults, quick.labels_used) == (
                full.verdict, full.ok, full.error, full.faults, full.labels_used), spec.run_id
            assert quick.race_keys() == full.race_keys(), spec.run_id
            assert quick.value_diffs == []
            verdicts.append(full.verdict)
    assert {"race", "race_free"} <= set(verdicts), verdicts
