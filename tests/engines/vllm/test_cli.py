"""``overlap-harness vllm --vllm-src PATH`` on a user's tree: a mirror of the installed vLLM
(every file a link, one file a copy) with one necessary sync removed exits 1 with races in
that tree's own file; the unedited mirror exits 0. Each run is a fresh process (vLLM is
imported once per process, from one tree). Skipped where vLLM is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from overlap_harness.engines.vllm.environment import VllmUnavailable, import_vllm

try:
    INFO = import_vllm()
except VllmUnavailable as exc:
    pytest.skip(str(exc), allow_module_level=True)

ROOT = Path(__file__).resolve().parents[3]
RUNNER = Path("v1") / "worker" / "gpu_model_runner.py"
FENCE = "self.async_copy_ready_event.synchronize()"


def _mirror(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    subprocess.run(["cp", "-rs", INFO.location, str(tree / "vllm")], check=True)
    runner = tree / "vllm" / RUNNER
    text = runner.read_text()
    runner.unlink()
    runner.write_text(text)  # a real file of the mirror, edited below
    return tree


def _run(tree: Path, *options: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "overlap_harness", "vllm", "--vllm-src",
                           str(tree), "--variant", "v1-async-output", *options],
                          capture_output=True, text=True, env=env, check=False, timeout=300)


@pytest.mark.engine_run
def test_a_tree_without_a_necessary_sync_races_at_its_own_lines(tmp_path: Path) -> None:
    tree = _mirror(tmp_path)
    intact = _run(tree)
    assert intact.returncode == 0, intact.stderr[-2000:]
    assert "v1-async-output: race-free" in intact.stdout
    runner = tree / "vllm" / RUNNER
    lines = runner.read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.strip() == FENCE)  # get_output's
    lines[index] = lines[index].replace(FENCE, "pass")
    runner.write_text("".join(lines))
    out = tmp_path / "out"
    racy = _run(tree, "--out", str(out))
    assert racy.returncode == 1, racy.stderr[-2000:]
    # every file named from the tree's root (the first line names the tree itself)
    assert "host-D2H" in racy.stdout and f"at vllm{os.sep}{RUNNER}:" in racy.stdout
    assert not [line for line in racy.stdout.splitlines()[1:] if str(tree) in line]
    races = json.loads((out / "vllm.json").read_text())["races"]
    files = {side["file"] for race in races for side in (race["first"], race["second"])}
    assert f"vllm{os.sep}{RUNNER}" in files and not any(map(os.path.isabs, files)), files
    # --out: the variant's plot of one step, its Perfetto trace and SARIF at the tree's lines
    variant = out / "v1-async-output"
    for written in (variant / "trace.json", variant / "results.sarif"):
        assert str(tree) not in written.read_text(), written
    assert sorted(p.name for p in (variant / "plots").iterdir()) == [
        "vllm-v1-async-output-iteration-2.png", "vllm-v1-async-output-iteration-2.svg"]
    assert json.loads((variant / "trace.json").read_text())["traceEvents"]
    sarif = json.loads((variant / "results.sarif").read_text())
    uris = {loc["physicalLocation"]["artifactLocation"]["uri"]
            for result in sarif["runs"][0]["results"] for loc in result["locations"]}
    assert sarif["runs"][0]["results"] and f"vllm/{RUNNER.as_posix()}" in uris


def _run_variants(tree: Path, out: Path, *variants: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    chosen = [arg for name in variants for arg in ("--variant", name)]
    return subprocess.run([sys.executable, "-m", "overlap_harness", "vllm", "--vllm-src",
                           str(tree), "--json", str(out), *chosen], capture_output=True,
                          text=True, env=env, check=False, timeout=300)


@pytest.mark.engine_run
def test_a_tree_without_the_v1_runner_runs_the_rest(tmp_path: Path) -> None:
    """As 0.34.0 ships: no vllm/v1/worker/gpu_model_runner.py. Its variants are not
    applicable, with what the tree lacks; Model Runner V2's run (exit 0)."""
    tree = _mirror(tmp_path)
    (tree / "vllm" / RUNNER).unlink()
    done = _run_variants(tree, tmp_path / "vllm.json", "v1-async-output", "mrv2-pooling")
    assert done.returncode == 0, done.stderr[-2000:]
    document = json.loads((tmp_path / "vllm.json").read_text())
    assert document["variants"] == ["mrv2-pooling"] and document["races"] == []
    assert document["not_applicable"] == [{
        "variant": "v1-async-output", "reason": "the tree lacks the V1 GPU model runner (no "
        "module vllm.v1.worker.gpu_model_runner)"}]
    assert "v1-async-output: not applicable" in done.stdout


@pytest.mark.engine_run
def test_a_variant_that_cannot_be_driven_exits_2_with_the_others_written(
        tmp_path: Path) -> None:
    """A changed AsyncPoolingOutput (its constructor raises): exit 2 naming the variant and
    the error; the JSON still holds the variant that ran."""
    tree = _mirror(tmp_path)
    utils = tree / "vllm" / "v1" / "worker" / "gpu" / "async_utils.py"
    lines = utils.read_text().splitlines(keepends=True)
    utils.unlink()
    start = next(i for i, line in enumerate(lines) if line.startswith("class AsyncPoolingOutput"))
    body = next(i for i in range(start, len(lines)) if lines[i].strip().startswith("):"))
    lines.insert(body + 1, "        raise RuntimeError('a changed constructor')\n")
    utils.write_text("".join(lines))
    done = _run_variants(tree, tmp_path / "vllm.json", "mrv2-pooling", "mrv2-uva-ring")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "variant mrv2-pooling cannot be driven on this tree: RuntimeError: a changed " \
           "constructor" in done.stderr
    document = json.loads((tmp_path / "vllm.json").read_text())
    assert document["variants"] == ["mrv2-uva-ring"] and document["races"] == []
    assert len(document["errors"]) == 1 and "mrv2-pooling" in document["errors"][0]


@pytest.mark.engine_run
def test_a_tree_with_a_syntax_error_exits_2_naming_its_line(tmp_path: Path) -> None:
    """The mirror's gpu_model_runner.py with a dangling ``+`` after the fence: exit 2, the
    last line names the file and line relative to the tree root, the JSON holds it. Its fixed
    twin is the intact mirror of the test above (exit 0)."""
    tree = _mirror(tmp_path)
    runner = tree / "vllm" / RUNNER
    lines = runner.read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.strip() == FENCE)
    lines[index] = lines[index].rstrip("\n") + " +\n"
    runner.write_text("".join(lines))
    done = _run(tree, "--json", str(tmp_path / "out.json"))
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("overlap-harness vllm: cannot import vllm.")
    assert last.endswith(f": vllm/{RUNNER.as_posix()}:{index + 1}: SyntaxError: invalid syntax")
    document = json.loads((tmp_path / "out.json").read_text())
    assert document["errors"] == [last.removeprefix("overlap-harness vllm: ")]
