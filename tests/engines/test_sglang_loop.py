"""SGLang's own ``event_loop_overlap`` under the recorder, through ``overlap-harness sglang``.

Every run is a child process, as a user runs the command: it imports SGLang once, from the
installed package or from a tree given with ``--sglang-src`` (a mirror of the installed package
whose one edited file is a real copy), and the verdicts are the detector's. Skipped, with the
import's own error, when SGLang or the light packages it imports are missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from overlap_harness.engines.sglang.variants import VARIANTS as ALL_VARIANTS
from tests.engines.sglang_trees import (
    ROOT,
    edited_tree,
    line_replaced,
    run_sglang,
    statement_at,
    unchanged,
)


def _plan_stream_side(race: dict) -> bool:
    """A race of the multi-layer worker's finding: one side on the plan stream."""
    return "plan_stream" in (race["first"]["stream"], race["second"]["stream"])


VARIANTS = tuple(ALL_VARIANTS)
#: the default variants SGLang 0.5.23 races on as released, each a finding of
#: docs/findings.md, with what each of its races must show (computed by the detector; the
#: fixed twins are in test_sglang_multi_layer_eagle.py and test_sglang_confidence_relay.py)
RACING_AS_RELEASED = {
    # the multi-layer worker's draft-extend preparation on the plan stream, not waiting for
    # the forward stream: every race has a side on the plan stream
    "multi_layer_eagle": _plan_stream_side,
    # the same finding under the multi-layer draft-extend CUDA graphs (one graph, per step)
    "multi_layer_eagle_graph": _plan_stream_side,
    "multi_layer_eagle_step_graphs": _plan_stream_side,
    # DSpark's confidence relay without host lengths: the ring copy (D2H stream) against the
    # next decode's scatter into confidence_buf, both in overlap_utils.py
    "dspark_no_host_lengths": lambda race: (
        race["kind"] == "WAR" and "confidence_buf" in race["tensor"]
        and {Path(race["first"]["file"]).name, Path(race["second"]["file"]).name}
        == {"overlap_utils.py"}),
}
RACE_FREE = tuple(name for name in VARIANTS if name not in RACING_AS_RELEASED)


def _command(*args: str, json_path: Path) -> tuple[int, str, dict]:
    return run_sglang(*args, json_path=json_path, timeout=600)


FORWARD_WAIT = "self.forward_stream.wait_stream(self.schedule_stream)"  # run_batch's first
KEEP_ALIVE = "self.batch_record_buf[self.batch_record_ct] = [batch, attr_snapshot]"


@pytest.fixture(scope="module")
def installed_run(tmp_path_factory):
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (docs/sglang-loop.md: install)")
    return _command(json_path=tmp_path_factory.mktemp("sglang") / "races.json")


@pytest.mark.parametrize("variant", RACE_FREE)
@pytest.mark.engine_run
def test_unmodified_loop_is_race_free(installed_run, variant):
    status, output, document = installed_run
    assert status == 1, output  # the variants of RACING_AS_RELEASED race
    assert variant in document["variants"]
    assert [r for r in document["races"] if r["variant"] == variant] == []
    assert f"  {variant}: race-free" in output


@pytest.mark.parametrize("variant", sorted(RACING_AS_RELEASED))
@pytest.mark.engine_run
def test_the_findings_variants_race_as_released(installed_run, variant):
    """The default run exits 1 on these alone, every race the finding's."""
    status, output, document = installed_run
    assert status == 1, output
    assert {r["variant"] for r in document["races"]} == set(RACING_AS_RELEASED)
    races = [r for r in document["races"] if r["variant"] == variant]
    assert races and all(RACING_AS_RELEASED[variant](r) for r in races), races[:2]


@pytest.mark.engine_run
def test_variants_in_reverse_order_in_one_process_are_race_free(tmp_path):
    """Each run starts from its own published configuration: what one variant leaves in
    SGLang's process-wide context (EAGLE's one-rank groups, a graph runner's config) never
    stops or changes a later one (a DP variant after EAGLE could not publish before)."""
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (docs/sglang-loop.md: install)")
    order = [word for name in reversed(VARIANTS) for word in ("--variant", name)]
    status, output, document = _command(*order, json_path=tmp_path / "races.json")
    assert status == 1, output
    assert {r["variant"] for r in document["races"]} == set(RACING_AS_RELEASED)
    assert all(RACING_AS_RELEASED[r["variant"]](r) for r in document["races"])
    assert [line.split(":")[0].strip() for line in output.splitlines()
            if line.endswith(")") and ": race-free (" in line] == list(reversed(RACE_FREE))


def _loop_report_sites(real: str) -> list[tuple[str, int, str]]:
    """(file inside sglang/, line, a variant) of each site whose removal the committed loop
    report marks ``real`` in some variant (``race``), or in every variant reaching it
    (``race_free``)."""
    rows = json.loads((ROOT / "reports/conformance/sglang-0.5.23-loop.json").read_text())["rows"]
    verdicts: dict[str, dict[str, str]] = {}
    for row in rows:
        if row["real"] != "not_reached":
            verdicts.setdefault(row["site"], {})[row["variant"]] = row["real"]
    chosen = []
    for site, by_variant in sorted(verdicts.items()):
        hits = [v for v, verdict in by_variant.items() if verdict == "race"]
        file, line = site.removeprefix("sglang/").rsplit(":", 1)
        if real == "race" and hits:
            chosen.append((file, int(line), hits[0]))
        elif real == "race_free" and not hits:
            chosen.append((file, int(line), next(iter(by_variant))))
    return chosen


def _tree_run(tmp_path: Path, old: str | None, variant: str,
              new: str = "pass") -> tuple[int, str, dict, Path]:
    tree = edited_tree(tmp_path, "srt/managers/scheduler.py",
                       unchanged if old is None else line_replaced(old, new))
    status, output, document = _command("--sglang-src", str(tree), "--variant", variant,
                                        json_path=tmp_path / "races.json")
    return status, output, document, tree


@pytest.mark.engine_run
def test_tree_without_the_forward_wait_races_in_its_own_files(tmp_path):
    status, output, document, tree = _tree_run(tmp_path, FORWARD_WAIT, "non_spec_decode")
    assert status == 1, output
    assert document["source"] == str(tree / "sglang")
    sides = [side for r in document["races"] for side in (r["first"], r["second"])]
    # the edited file is the copy's own (the mirror's other files are symlinks, which a run
    # may report by the path they resolve to): named from the tree's root, as a file
    # outside the tree would not be
    assert any(s["file"] == "sglang/srt/managers/scheduler.py" for s in sides)
    assert {r["kind"] for r in document["races"]} >= {"RAW"}


@pytest.mark.engine_run
def test_twin_tree_with_the_forward_wait_is_race_free(tmp_path):
    status, output, document, _tree_dir = _tree_run(tmp_path, None, "non_spec_decode")
    assert status == 0, output
    assert document["races"] == []


@pytest.mark.slow
@pytest.mark.engine_run
def test_tree_without_the_redundant_keep_alive_is_race_free(tmp_path):
    status, output, document, _tree_dir = _tree_run(tmp_path, KEEP_ALIVE, "non_spec_decode")
    assert status == 0, output
    assert document["races"] == []


def _site_run(tmp_path: Path, file: str, line: int, variant: str) -> tuple[int, str, dict,
                                                                          Path]:
    tree = edited_tree(tmp_path, file, statement_at(line))
    status, output, document = _command("--sglang-src", str(tree), "--variant", variant,
                                        json_path=tmp_path / "races.json")
    return status, output, document, tree


def _assert_races_in_tree(status: int, output: str, document: dict, tree: Path) -> None:
    assert status == 1, output
    sides = [side for r in document["races"] for side in (r["first"], r["second"])]
    # in the tree: named from its root (a file outside the tree and the harness is absolute)
    assert any(s["file"].startswith("sglang" + os.sep) for s in sides), output


@pytest.mark.engine_run
def test_tree_without_async_d2h_record_stream_races_in_its_own_files(tmp_path):
    """A necessary line outside scheduler.py (utils/common.py's async_d2h)."""
    status, output, document, tree = _site_run(tmp_path, "srt/utils/common.py", 616,
                                               "non_spec_decode")
    _assert_races_in_tree(status, output, document, tree)
    assert {r["kind"] for r in document["races"]} == {"reuse"}


@pytest.mark.slow
@pytest.mark.parametrize("file, line, variant", _loop_report_sites("race"))
@pytest.mark.engine_run
def test_every_necessary_site_removed_from_a_tree_exits_1(tmp_path, file, line, variant):
    _assert_races_in_tree(*_site_run(tmp_path, file, line, variant))


@pytest.mark.slow
@pytest.mark.parametrize("file, line, variant", _loop_report_sites("race_free"))
@pytest.mark.engine_run
def test_every_redundant_site_removed_from_a_tree_exits_0(tmp_path, file, line, variant):
    status, output, document, _tree_dir = _site_run(tmp_path, file, line, variant)
    assert status == 0, output
    assert document["races"] == []


@pytest.mark.engine_run
def test_a_tree_calling_what_the_driver_did_not_plan_exits_2_naming_it(tmp_path):
    old = "self.profiler_manager._profile_batch_predicate(batch)"
    status, output, _document, tree = _tree_run(
        tmp_path, old, "non_spec_decode", new="self.profiler_manager.start_profile(batch)")
    assert status == 2, output
    scheduler = tree / "sglang/srt/managers/scheduler.py"
    line = next(i for i, text in enumerate(scheduler.read_text().splitlines(), 1)
                if "start_profile(batch)" in text)
    assert output.strip().splitlines()[-1] == (
        "overlap-harness sglang: variant non_spec_decode cannot be driven on this tree: "
        "UnplannedUseError: profiler_manager.start_profile: not planned by the driver "
        f"(strict stub) at {scheduler.relative_to(tree)}:{line} in run_batch")


def test_a_missing_tree_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "overlap_harness", "sglang", "--sglang-src",
                           str(tmp_path / "nowhere")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert done.returncode == 2
    assert done.stderr == (f"overlap-harness sglang: {tmp_path / 'nowhere'}: no sglang package "
                           "here or in its python/ folder\n")




def _pytest_items(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (folder / "test_plain.py").write_text("def test_plain():\n    assert 2 + 2 == 4\n")
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
                           "overlap_harness.engines.sglang.pytest_items", *args, "-q",
                           "test_plain.py"], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600,
                          check=False)


def test_pytest_items_collect_nothing_unless_asked(tmp_path):
    done = _pytest_items(tmp_path)
    assert done.returncode == 0, done.stdout
    assert "1 passed" in done.stdout


@pytest.mark.engine_run
def test_pytest_with_sglang_src_alone_collects_the_loops_items(tmp_path):
    """Installed, the package's pytest11 entry point brings the items: ``pytest --sglang-src
    PATH`` needs no ``-p`` and no ``--sglang-loop``; without either option nothing is added
    (a plain test folder runs as before)."""
    from importlib.metadata import entry_points

    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (docs/sglang-loop.md: install)")
    plugin = "overlap_harness.engines.sglang.pytest_items"
    if plugin not in {ep.name for ep in entry_points(group="pytest11")}:
        pytest.skip("overlap-harness is not installed here (its entry points are absent)")
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert 2 + 2 == 4\n")
    installed = Path(importlib.util.find_spec("sglang").origin).parents[1]

    def collected(*args: str) -> list[str]:
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                               "--collect-only", "-q", *args, "test_plain.py"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return [line for line in done.stdout.splitlines() if "::" in line]

    items = collected("--sglang-src", str(installed), "--sglang-variant", "idle_iteration")
    assert any(line.endswith("::test_plain") for line in items), items  # node ids are
    # relative to a rootdir pytest picks above the folder: only their ends are compared
    assert any(line.endswith("::sglang-loop::idle_iteration") for line in items), items
    assert any("idle_iteration[scheduler.py:" in line for line in items), items
    plain = collected()
    assert len(plain) == 1 and plain[0].endswith("::test_plain"), plain


@pytest.mark.slow
@pytest.mark.engine_run
def test_pytest_items_one_per_variant_and_site_with_their_verdicts(tmp_path):
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (docs/sglang-loop.md: install)")
    done = _pytest_items(tmp_path, "--sglang-loop", "--sglang-variant", "idle_iteration",
                         "--junitxml", str(tmp_path / "junit.xml"))
    assert done.returncode == 0, done.stdout
    import xml.etree.ElementTree as ET

    verdicts = {case.get("name"): {p.get("name"): p.get("value")
                                   for p in case.iter("property")}
                for case in ET.parse(tmp_path / "junit.xml").iter("testcase")}
    assert "idle_iteration" in verdicts
    assert verdicts["idle_iteration[scheduler.py:4672]"]["verdict"] == "necessary"
    assert verdicts["idle_iteration[scheduler.py:4567]"]["verdict"] == "redundant"
    assert verdicts["idle_iteration[overlap_utils.py:497]"]["verdict"] == "not_reached"


GRAPH_RUNNER = "srt/model_executor/runner/decode_cuda_graph_runner.py"


@pytest.mark.parametrize("remove_in_graph_record", [True, False])
@pytest.mark.engine_run
def test_tree_without_the_in_graph_read_done_record_races_in_its_own_files(
        tmp_path, remove_in_graph_record):
    """Decode under CUDA graphs: the tree's decode graph runner without the ``event.record()``
    it captures into each graph (its read-done event never recorded, the WAR barrier's wait a
    no-op) exits 1 with races in the tree's files; the unedited twin exits 0."""
    def without_the_record(text: str) -> str:
        line = next(n for n, code in enumerate(text.splitlines(), 1)
                    if code.strip() == "event.record()")
        return statement_at(line)(text)
    tree = edited_tree(tmp_path, GRAPH_RUNNER,
                       without_the_record if remove_in_graph_record else unchanged)
    status, output, document = _command("--sglang-src", str(tree), "--variant",
                                        "graph_decode_radix", json_path=tmp_path / "races.json")
    if not remove_in_graph_record:
        assert (status, document["races"]) == (0, []), output
        return
    assert status == 1, output
    assert document["source"] == str(tree / "sglang")
    assert {r["kind"] for r in document["races"]} == {"WAR"}
    sides = [side for r in document["races"] for side in (r["first"], r["second"])]
    # every SGLang side in the tree (named from its root; one outside would be absolute)
    assert not any(os.path.isabs(s["file"]) and "/sglang/" in s["file"] for s in sides)
    assert any(s["file"].endswith("runner_backend/full_cuda_graph_backend.py") for s in sides)
