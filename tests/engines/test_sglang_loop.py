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

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("non_spec_decode", "non_spec_decode_hip", "chunked_prefill", "radix_cache",
            "idle_iteration", "retracted_request")
FORWARD_WAIT = "self.forward_stream.wait_stream(self.schedule_stream)"  # run_batch's first
KEEP_ALIVE = "self.batch_record_buf[self.batch_record_ct] = [batch, attr_snapshot]"


def _command(*args: str, json_path: Path) -> tuple[int, str, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "overlap_harness", "sglang", *args, "--json",
                           str(json_path)], capture_output=True, text=True, env=env,
                          timeout=600, check=False)
    output = done.stdout + done.stderr
    if done.returncode == 2 and "overlap-harness sglang: import " in output:
        pytest.skip(output.strip().splitlines()[-1])
    document = json.loads(json_path.read_text()) if json_path.exists() else {}
    return done.returncode, output, document


@pytest.fixture(scope="module")
def installed_run(tmp_path_factory):
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (docs/sglang-loop.md: install)")
    return _command(json_path=tmp_path_factory.mktemp("sglang") / "races.json")


@pytest.mark.parametrize("variant", VARIANTS)
def test_unmodified_loop_is_race_free(installed_run, variant):
    status, output, document = installed_run
    assert status == 0, output
    assert variant in document["variants"]
    assert [r for r in document["races"] if r["variant"] == variant] == []
    assert f"  {variant}: race-free" in output


def _mirror(source: Path, target: Path, edited: Path, old: str | None,
            new: str = "pass") -> None:
    """``target`` mirrors ``source`` with symlinks, except the file ``edited`` (relative),
    a real copy with the first line holding ``old`` made ``new`` (same line numbers)."""
    target.mkdir()
    head = edited.parts[0]
    for entry in source.iterdir():
        if entry.name == head and len(edited.parts) > 1:
            _mirror(entry, target / head, Path(*edited.parts[1:]), old, new)
        elif entry.name == head:
            lines = entry.read_text().splitlines(keepends=True)
            if old is not None:
                index = next(i for i, line in enumerate(lines) if line.strip() == old)
                indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
                lines[index] = f"{indent}{new}\n"
            (target / head).write_text("".join(lines))
        elif entry.name != "__pycache__":
            (target / entry.name).symlink_to(entry)


def _tree(tmp_path: Path, old: str | None, new: str) -> Path:
    installed = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
    tree = tmp_path / "tree"
    tree.mkdir()
    _mirror(installed, tree / "sglang", Path("srt/managers/scheduler.py"), old, new)
    return tree


def _tree_run(tmp_path: Path, old: str | None, variant: str,
              new: str = "pass") -> tuple[int, str, dict, Path]:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (docs/sglang-loop.md: install)")
    tree = _tree(tmp_path, old, new)
    status, output, document = _command("--sglang-src", str(tree), "--variant", variant,
                                        json_path=tmp_path / "races.json")
    return status, output, document, tree


def test_tree_without_the_forward_wait_races_in_its_own_files(tmp_path):
    status, output, document, tree = _tree_run(tmp_path, FORWARD_WAIT, "non_spec_decode")
    assert status == 1, output
    assert document["source"] == str(tree / "sglang")
    sides = [side for r in document["races"] for side in (r["first"], r["second"])]
    assert any(s["file"] == str(tree / "sglang/srt/mem_cache/memory_pool.py") for s in sides)
    assert {r["kind"] for r in document["races"]} >= {"RAW"}


def test_twin_tree_with_the_forward_wait_is_race_free(tmp_path):
    status, output, document, _tree_dir = _tree_run(tmp_path, None, "non_spec_decode")
    assert status == 0, output
    assert document["races"] == []


@pytest.mark.slow
def test_tree_without_the_redundant_keep_alive_is_race_free(tmp_path):
    status, output, document, _tree_dir = _tree_run(tmp_path, KEEP_ALIVE, "non_spec_decode")
    assert status == 0, output
    assert document["races"] == []


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
        f"(strict stub) at {scheduler}:{line}")


def test_a_missing_tree_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "overlap_harness", "sglang", "--sglang-src",
                           str(tmp_path / "nowhere")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert done.returncode == 2
    assert done.stderr == (f"overlap-harness sglang: {tmp_path / 'nowhere'}: no sglang package "
                           "here or in its python/ folder\n")


