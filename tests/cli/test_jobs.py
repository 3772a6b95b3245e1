"""``run -j N``: the runs shared among forked processes give the results of one process,
in the same order, and the plot workers still get every racy case (issue 17 item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlap_harness.cli import main
from overlap_harness.runner import run_scenarios
from overlap_harness.scenarios.loader import load_paths
from tests.cli.conftest import TWIN, write

REPO = Path(__file__).resolve().parents[2]
SUITE_PART = [REPO / "scenarios" / "protocol" / name for name in
              ("s01_stash_gather_fifo.toml", "s02_schedule_waits_publish.toml",
               "s03_d2h_waits_publish.toml")]


def test_runs_in_processes_give_the_results_of_one_process(tmp_path) -> None:
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    paths = [str(p) for p in SUITE_PART]
    assert main(["run", *paths, "--no-reports", "-q", "-j", "1", "--json", str(one)]) == 0
    assert main(["run", *paths, "--no-reports", "-q", "-j", "2", "--json", str(two)]) == 0
    assert one.read_bytes() == two.read_bytes()
    assert one.read_text().count('"run_id"') > 2


def test_each_result_reaches_on_result_in_spec_order_from_the_processes(tmp_path) -> None:
    scenarios = load_paths([write(tmp_path, "twin.toml", TWIN), *SUITE_PART[:1]])
    seen: list = []
    results = run_scenarios(scenarios, on_result=seen.append, jobs=2)
    assert [r.run_id for r in seen] == [r.run_id for r in results]
    assert [r.run_id for r in results] == [r.run_id for r in run_scenarios(scenarios)]
    assert any(r.races for r in results) and any(not r.races for r in results)


@pytest.mark.parametrize("jobs", ["0", "-2"])
def test_fewer_than_one_process_is_refused_with_one_line(jobs, capsys) -> None:
    assert main(["run", str(SUITE_PART[0]), "--no-reports", "-q", "-j", jobs]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"overlap-harness run: error: argument -j/--jobs: expected a whole number "
                   f"of at least 1, got {jobs} (see overlap-harness run --help)"]


def test_reports_from_processes_have_a_plot_per_racy_run(tmp_path) -> None:
    out = tmp_path / "out"
    twin = write(tmp_path, "twin.toml", TWIN)  # a race-free base and a racy mutation
    assert main(["run", str(twin), "-q", "-j", "2", "--out", str(out)]) == 0
    pngs = sorted((out / "plots").glob("*.png"))
    assert len(pngs) == 1 and pngs[0].name.startswith("twin_")
    assert f"plots/{pngs[0].name}" in (out / "summary.md").read_text()
