"""The necessity table skips what the intact runs never reach (overlap_harness/engines/core/
reach.py): on a small program of its own with three waits - one every variant reaches, one
only the variant ``both`` reaches, one no variant reaches - the table with the probed pass
equals the table that runs every site with every variant, and fewer variant runs are made;
so does the table whose intact runs were probed as they ran (no probed pass of its own).
Every verdict is computed (races by the recorder)."""

from __future__ import annotations

import importlib.util
import os
import sys
import textwrap
from pathlib import Path

import pytest

from overlap_harness.engines.core.necessity import necessity_table
from overlap_harness.engines.core.progress import Progress
from overlap_harness.engines.core.reach import IntactReach
from overlap_harness.engines.core.results import VariantOutcome, race_record
from overlap_harness.engines.core.sites import scan

PROGRAM = textwrap.dedent("""\
    import torch


    class Loop:
        def step(self, producer, consumer, second):
            with torch.cuda.stream(producer):
                data = torch.ones(4, device="cuda")
                more = torch.ones(4, device="cuda")
            consumer.wait_stream(producer)
            with torch.cuda.stream(consumer):
                total = data.sum()
            if second:
                producer.wait_stream(consumer)
                with torch.cuda.stream(producer):
                    data.add_(1)
            return total, more

        def never(self, producer, consumer):
            consumer.wait_stream(producer)
    """)
VARIANTS = ("first", "both")


@pytest.fixture
def loop_program(tmp_path: Path) -> Path:
    path = tmp_path / "reach_program.py"
    path.write_text(PROGRAM)
    spec = importlib.util.spec_from_file_location("reach_program", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["reach_program"] = module
    spec.loader.exec_module(module)
    yield path
    sys.modules.pop("reach_program", None)


RUNS_LOG = "OVERLAP_HARNESS_TEST_RUNS_LOG"


def run_variant(variant: str) -> VariantOutcome:
    """One variant under the recorder; each run is logged (one line) to count them."""
    import torch

    import overlap_harness.recorder as recorder

    with open(os.environ[RUNS_LOG], "a") as log:
        log.write(variant + "\n")
    with recorder.watch(mode="cpu") as watch:
        sys.modules["reach_program"].Loop().step(torch.cuda.Stream(), torch.cuda.Stream(),
                                                 variant == "both")
        torch.cuda.synchronize()
    return VariantOutcome(variant, races=[race_record(r, variant) for r in watch.races])


def _table(program: Path, skip: bool, log: Path, monkeypatch: pytest.MonkeyPatch
           ) -> tuple[list[tuple[str, str, str, int]], int]:
    monkeypatch.setenv(RUNS_LOG, str(log))
    baseline = {v: run_variant(v) for v in VARIANTS}
    log.write_text("")
    rows = necessity_table(scan(program), VARIANTS, baseline, run_variant, jobs=2,
                           skip_unreached=skip)
    table = [(Path(r.site).name, r.variant, str(r.verdict), len(r.races)) for r in rows]
    return table, len(log.read_text().splitlines())


def test_the_table_skips_unreached_sites_and_stays_the_same(
        loop_program: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full, full_runs = _table(loop_program, False, tmp_path / "full.log", monkeypatch)
    skipped, skipped_runs = _table(loop_program, True, tmp_path / "skip.log", monkeypatch)
    assert skipped == full
    verdicts = {(site, variant): verdict for site, variant, verdict, _ in full}
    assert verdicts[("reach_program.py:9", "first")] == "necessary"
    assert verdicts[("reach_program.py:13", "first")] == "not_reached"
    assert verdicts[("reach_program.py:13", "both")] == "necessary"
    assert {verdicts[("reach_program.py:19", v)] for v in VARIANTS} == {"not_reached"}
    # full: 3 sites x 2 variants; skipped: the probed pass (2) + line 9 (2) + line 13 (1)
    assert (full_runs, skipped_runs) == (6, 5)


def test_probes_in_the_intact_runs_give_the_same_table_without_a_probed_pass(
        loop_program: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full, _ = _table(loop_program, False, tmp_path / "full.log", monkeypatch)
    log = tmp_path / "intact.log"
    monkeypatch.setenv(RUNS_LOG, str(log))
    sites = scan(loop_program)
    reach = IntactReach(sites)
    baseline = {v: reach.counted(run_variant)(v) for v in VARIANTS}
    assert len(reach.probed) == 3
    assert {v: sorted(Path(k).name for k in keys) for v, keys in reach.reached.items()} == {
        "first": ["reach_program.py:9"],
        "both": ["reach_program.py:13", "reach_program.py:9"]}
    log.write_text("")
    rows = necessity_table(sites, VARIANTS, baseline, run_variant, jobs=2, reach=reach)
    table = [(Path(r.site).name, r.variant, str(r.verdict), len(r.races)) for r in rows]
    assert table == full
    assert len(log.read_text().splitlines()) == 3  # line 9 (2) + line 13 (1), nothing else


def test_progress_is_one_line_per_major_step_off_a_terminal_and_quiet_hides_it(
        tmp_path: Path) -> None:
    out = tmp_path / "progress.txt"
    with out.open("w") as stream:
        progress = Progress("necessity", stream=stream, show=True)
        progress.step("site 1/2 a.py:3, variant x (1/2)", 0.0)
        progress.step("site 1/2 a.py:3, variant y (2/2)", 0.25, major=False)
        progress.step("site 2/2 b.py:4, variant x (1/2)", 0.5)
        progress.done("2 of 2 sites run")
        Progress("necessity", stream=stream, show=False).step("hidden", 0.5)
    lines = out.read_text().splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "necessity: site 1/2 a.py:3", "necessity: site 2/2 b.py:4",
        "necessity: 2 of 2 sites run in 0 s"]
    assert "left" in lines[1] and "\r" not in out.read_text()
