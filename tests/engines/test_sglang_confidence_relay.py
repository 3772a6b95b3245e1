"""SGLang 0.5.23's DSpark confidence relay in its own loop (features/dspark.py): the scheduler's
FutureMap, built by SGLang with ``needs_confidence_relay``, relays each decode's draft
confidence through ``ConfidenceRelay.issue_ring_copy`` (overlap_utils.py:241 the D2H
stream's wait on ``publish_ready``, :244 ``copy_done[slot].record()``) to SGLang's verify
planner, which reads the pinned ring slot on the host two steps later.

One child process imports SGLang once and runs, every verdict the detector's:

* variant ``dspark_confidence_relay`` (backends that need host sequence lengths) as released
  (race-free, the planner's budgets computed from the relayed confidence), without :241 (the
  ring copy reads ``confidence_buf`` before the scatter is published: RAW) and without :244
  or the resolve's query (race-free both: ``resolve_seq_lens_cpu`` synchronizes the same D2H
  stream every decode, which orders the ring copies before the host read; the site is
  reached and redundant here);
* ``DSPARK_GPU_LENS``, the default variant ``dspark_no_host_lengths`` (backends that all
  declare they need none: FlashAttention-3 without a KV-shard pool, DeepSeek-V4's under
  DSpark): as released it
  races, the ring copy's read of ``confidence_buf`` against the next decode's scatter (WAR;
  nothing orders the D2H stream before the forward stream), and never reads the ring (the
  copy_done query's first answer is False); its fixed twin, a copy of SGLang's
  ``ConfidenceRelay.scatter`` whose stream first waits on the last ring copy's ``copy_done``,
  is race-free; with that fix and :244 removed the query says done at once and the host
  reads the pinned ring while its copy may still run (host-D2H at the copy's lines); the
  same with the resolve's host wait (``copy_done[slot].query()``) removed instead.

Tree copies (slow) run the command on a tree without :241 and on one as released.
"""

from __future__ import annotations

import pytest

from overlap_harness.engines.sglang import release_features
from overlap_harness.engines.sglang.variants import DSPARK_GPU_LENS, VARIANTS
from tests.engines.sglang_trees import (
    edited_tree,
    run_child,
    run_sglang,
    statement_passed,
    unchanged,
)

VARIANT = "dspark_confidence_relay"
WAIT = "stream.wait_event(publish_ready)"
RECORD = "self.copy_done[slot].record()"
SCATTER = "self.confidence_buf[indices] = confidence.to(self.confidence_buf.dtype)"
#: the resolve's host wait on the slot's copy (an early return while the copy is not done)
QUERY = "if not self.copy_done[slot].query():"
#: the fixed twin's wait, inserted before SCATTER in a copy of ConfidenceRelay.scatter
LAST_COPY_WAIT = (
    "if self.copy_done is not None and self.ring_pos > 0:\n"
    "    torch.get_device_module(self.device).current_stream().wait_event(\n"
    "        self.copy_done[(self.ring_pos - 1) % CONFIDENCE_RELAY_RING_DEPTH])\n")

CHILD = """
import importlib, inspect, json, tempfile
from pathlib import Path
from overlap_harness.engines.core.mutation import function_from_file, removed, site
from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.results import race_record
from overlap_harness.engines.sglang.driver import run_variant
from overlap_harness.engines.sglang.variants import DSPARK_GPU_LENS, VARIANTS
variant_name, wait, record, scatter, fix, query = (json.loads(arg) for arg in sys.argv[1:7])
ou = importlib.import_module("sglang.srt.managers.overlap_utils")

def edited(function, line_text, replacement):
    # ConfidenceRelay.<function> compiled from a copy of SGLang's file whose line reading
    # line_text is replaced by the replacement's lines (at its indentation)
    lines = Path(inspect.getsourcefile(ou)).read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.strip() == line_text)
    indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
    lines[index:index + 1] = [indent + line + "\\n" for line in replacement.splitlines()]
    path = Path(tempfile.mkdtemp()) / "overlap_utils.py"
    path.write_text("".join(lines))
    return function_from_file(path, "ConfidenceRelay", function, vars(ou))

FIXED = ("scatter", scatter, fix + scatter)
NO_QUERY = ("resolve", query, "if False:")  # the host wait gone, every line kept

def run(variant, cut=None, *edits):
    patches = [(ou.ConfidenceRelay, name, edited(name, text, new)) for name, text, new in edits]
    with attributes_set(patches):
        if cut is None:
            loop = run_variant(variant)
            line = None
        else:
            target = site(ou.ConfidenceRelay, "issue_ring_copy", cut)
            with removed(target):
                loop = run_variant(variant)
            line = target.line
    relay = loop.scheduler.future_map.confidence_relay
    return {"races": [race_record(r, variant.name) for r in loop.races],
            "unknown": loop.unknown_ops, "line": line,
            "needs_confidence_relay": loop.scheduler.future_map.needs_confidence_relay,
            "ring_pos": relay.ring_pos, "budgets": loop.scheduler.draft_worker.budgets,
            "published": len(loop.scheduler.draft_worker.published_confidences)}

default = VARIANTS[variant_name]
out = {"intact": run(default), "no_wait": run(default, wait), "no_record": run(default, record),
       "no_query": run(default, None, NO_QUERY),
       "gpu_lens": run(DSPARK_GPU_LENS), "gpu_lens_fixed": run(DSPARK_GPU_LENS, None, FIXED),
       "gpu_lens_fixed_no_record": run(DSPARK_GPU_LENS, record, FIXED),
       "gpu_lens_fixed_no_query": run(DSPARK_GPU_LENS, None, FIXED, NO_QUERY)}
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs():
    return run_child(CHILD, VARIANT, WAIT, RECORD, SCATTER, LAST_COPY_WAIT, QUERY)


def _pairs(races: list[dict], kind: str, tensor: str) -> set[tuple]:
    """(first file:line, first stream, second file:line, second stream) of the races of
    ``kind`` on ``tensor`` (its name before ``@``), file names only."""
    return {(f"{r['first']['file'].rsplit('/', 1)[-1]}:{r['first']['line']}",
             r["first"]["stream"],
             f"{r['second']['file'].rsplit('/', 1)[-1]}:{r['second']['line']}",
             r["second"]["stream"])
            for r in races if r["kind"] == kind and r["tensor"].split("@")[0] == tensor}


@pytest.mark.engine_run
def test_the_relay_is_race_free_as_released_and_the_host_reads_the_ring(runs):
    """SGLang built the FutureMap with the relay on; every decode published a confidence and
    issued a ring copy, and from the third decode on the planner's budget came from the
    ring (the first two find the ring within its lag of 2 and note a non-decode step)."""
    intact = runs["intact"]
    assert intact["races"] == [] and intact["unknown"] == []
    assert intact["needs_confidence_relay"] is True
    assert intact["ring_pos"] == intact["published"] == len(intact["budgets"]) > 3
    assert intact["budgets"][:2] == [None, None]
    assert all(isinstance(b, int) for b in intact["budgets"][2:])


@pytest.mark.engine_run
def test_without_the_publish_wait_the_ring_copy_reads_the_unpublished_confidence(runs):
    """:241 removed: the D2H stream's copy of confidence_buf (:243) is unordered after the
    forward stream's scatter (:235) of the same decode (RAW)."""
    cut = runs["no_wait"]
    assert cut["line"] == 241
    assert ("overlap_utils.py:235", "self.forward_stream", "overlap_utils.py:243",
            "self.fwd_prepare_d2h_stream") in _pairs(cut["races"], "RAW", "self.confidence_buf")


@pytest.mark.engine_run
def test_without_the_copy_record_the_seq_lens_synchronize_still_orders_the_ring(runs):
    """:244 removed, the query never sees a record and says done at once; the host's read of
    the slot is still after its copy: resolve_seq_lens_cpu synchronized the D2H stream
    (overlap_utils.py:639) before the budget prepare ran. Reached and redundant here."""
    cut = runs["no_record"]
    assert cut["line"] == 244 and cut["races"] == []
    assert cut["budgets"] == runs["intact"]["budgets"]


@pytest.mark.engine_run
def test_without_the_query_the_seq_lens_synchronize_still_orders_the_ring(runs):
    """The resolve's host wait gone (``if False:``): the same, the host already knows every
    copy before the last decode's done."""
    cut = runs["no_query"]
    assert cut["races"] == [] and cut["budgets"] == runs["intact"]["budgets"]


@pytest.mark.engine_run
def test_without_host_lengths_the_ring_copy_races_the_next_scatter_as_released(runs):
    """Backends that need no host lengths: the D2H stream only waits for the forward stream,
    never the other way, so the next decode's scatter into confidence_buf (:235, forward
    stream) may overwrite it under the ring copy (:243) still reading it (WAR). The query of
    each copy_done is its first (False: the planner never reads the ring here)."""
    released = runs["gpu_lens"]
    assert released["needs_confidence_relay"] is True
    assert _pairs(released["races"], "WAR", "self.confidence_buf") == {
        ("overlap_utils.py:243", "self.fwd_prepare_d2h_stream", "overlap_utils.py:235",
         "self.forward_stream")}
    assert {r["kind"] for r in released["races"]} == {"WAR"}
    assert set(released["budgets"]) == {None}


@pytest.mark.engine_run
def test_the_scatter_waiting_on_the_last_ring_copy_is_the_fixed_twin(runs):
    fixed = runs["gpu_lens_fixed"]
    assert fixed["races"] == [] and fixed["unknown"] == []
    assert fixed["ring_pos"] == runs["gpu_lens"]["ring_pos"] > 3


@pytest.mark.engine_run
def test_without_the_copy_record_the_host_reads_the_ring_under_its_copy(runs):
    """The fixed twin without :244: the query says done at once, the planner reads the slot
    on the host (:276) while its copy (:243) may still run (host-D2H on the pinned ring)."""
    cut = runs["gpu_lens_fixed_no_record"]
    assert cut["line"] == 244
    assert ("overlap_utils.py:243", "self.fwd_prepare_d2h_stream", "overlap_utils.py:276",
            "host") in _pairs(cut["races"], "host-D2H", "self.conf_ring")
    assert any(isinstance(b, int) for b in cut["budgets"])


@pytest.mark.engine_run
def test_without_the_query_the_host_reads_the_ring_under_its_copy(runs):
    """The fixed twin without the resolve's host wait: the slot read (:276) from the second
    lagged decode on, unordered after its copy (:243); and the ring is read from the first
    decode past the lag (no first False answer)."""
    cut = runs["gpu_lens_fixed_no_query"]
    assert ("overlap_utils.py:243", "self.fwd_prepare_d2h_stream", "overlap_utils.py:276",
            "host") in _pairs(cut["races"], "host-D2H", "self.conf_ring")
    assert cut["budgets"][:2] == [None, None]
    assert all(isinstance(b, int) for b in cut["budgets"][2:])


def test_a_release_without_the_relay_is_not_applicable_by_feature(monkeypatch):
    """The variant needs the relay's ring copy, the planner's budget prepare and the DFlash
    draft input (and the D2H stream for host lengths); a release whose module lacks one is
    not applicable, the reason naming the module (no SGLang needed: the lookup is faked)."""
    needed = {f.where() for f in release_features.required_features(VARIANTS[VARIANT])}
    assert {"sglang.srt.managers.overlap_utils:ConfidenceRelay.issue_ring_copy",
            "sglang.srt.speculative.dspark_components.dspark_planner:"
            "DSparkVerifyPlanner.prepare_verify_budget",
            "sglang.srt.speculative.dflash_info_v2:DFlashDraftInputV2.prepare_for_decode",
            "sglang.srt.managers.overlap_utils:FutureMap.resolve_seq_lens_cpu"} <= needed
    assert ("sglang.srt.managers.overlap_utils:FutureMap.resolve_seq_lens_cpu" not in
            {f.where() for f in release_features.required_features(DSPARK_GPU_LENS)})
    monkeypatch.setattr(release_features, "lacks", lambda feature: (
        f"no module {feature.module}" if feature.module.endswith("dspark_planner") else None))
    reason = release_features.not_applicable_reason(VARIANTS[VARIANT])
    assert reason == ("the release lacks DSpark's verify planner preparing the verify budget "
                      "from the relayed confidence: no module "
                      "sglang.srt.speculative.dspark_components.dspark_planner")


def _tree_command(tmp_path, edit) -> tuple[int, str, dict]:
    tree = edited_tree(tmp_path, "srt/managers/overlap_utils.py", edit)
    return run_sglang("--sglang-src", str(tree), "--variant", VARIANT,
                      json_path=tmp_path / "races.json", timeout=600)


@pytest.mark.slow
@pytest.mark.engine_run
def test_tree_without_the_publish_wait_races_in_its_own_file(tmp_path):
    status, output, document = _tree_command(tmp_path, statement_passed("issue_ring_copy", WAIT))
    assert status == 1, output
    own = "sglang/srt/managers/overlap_utils.py"  # the tree's, named from its root
    raw = [r for r in document["races"] if r["kind"] == "RAW"
           and r["tensor"].startswith("self.confidence_buf@")]
    assert raw and {(r["second"]["file"], r["second"]["line"]) for r in raw} == {(own, 243)}


@pytest.mark.slow
@pytest.mark.engine_run
def test_tree_as_released_is_race_free(tmp_path):
    status, output, document = _tree_command(tmp_path, unchanged)
    assert status == 0, output
    assert document["races"] == []
