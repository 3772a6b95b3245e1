"""SGLang's EAGLE v2 worker inside its own ``event_loop_overlap``, under the recorder.

One child process imports SGLang once and runs each EAGLE variant twice: as released (the
fixed twin) and with one spec-v2 sync statement removed from SGLang's own function
(recompiled from its file, so races name SGLang's lines). Every verdict is the detector's.
Skipped, with the import's own error, when SGLang or the packages it imports are missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines.sglang_trees import run_child

#: variant -> (module, owner, function, a piece of the removed line, SGLang files the races
#: must name): a sync the variant needs, found necessary by ``--necessity``
REMOVALS = {
    # the draft-extend joins the plan stream that prepared its batch
    "eagle_topk1": ("sglang.srt.speculative.eagle_worker_v2", "EagleDraftWorker",
                    "_draft_extend_for_decode", "current_stream().wait_stream(",
                    ("eagle_worker_common.py", "forward_batch_info.py")),
    # tree drafting (topk 4): the same join
    "eagle_topk4": ("sglang.srt.speculative.eagle_worker_v2", "EagleDraftWorker",
                    "_draft_extend_for_decode", "current_stream().wait_stream(",
                    ("eagle_worker_common.py", "forward_batch_info.py")),
    # the private D2H stream waits for the forward's publish of the new lengths
    "eagle_d2h_stream": ("sglang.srt.managers.overlap_utils", "FutureMap",
                         "resolve_seq_lens_cpu",
                         "self.fwd_prepare_d2h_stream.wait_event(self.publish_ready)",
                         ("overlap_utils.py",)),
    # the mixed batch's decode tails: the host waits for the private stream's copy of the
    # published lengths before reading them
    "eagle_mixed": ("sglang.srt.managers.overlap_utils", "FutureMap",
                    "resolve_mixed_spec_tails", "self.fwd_prepare_d2h_stream.synchronize()",
                    ("overlap_utils.py",)),
}

CHILD = """
import importlib, json
from overlap_harness.engines.core.mutation import removed, site
from overlap_harness.engines.core.results import race_record
from overlap_harness.engines.sglang.driver import run_variant
from overlap_harness.engines.sglang.variants import VARIANTS
out = {}
for name, (module, owner, function, needle, _files) in json.loads(sys.argv[1]).items():
    variant = VARIANTS[name]
    intact = run_variant(variant)
    target = site(getattr(importlib.import_module(module), owner), function, needle)
    with removed(target):
        mutated = run_variant(variant)
    out[name] = {"intact": [race_record(r, name) for r in intact.races],
                 "removed": [race_record(r, name) for r in mutated.races],
                 "line": target.line, "iterations": intact.iterations,
                 "forwards": intact.forwards, "unknown": intact.unknown_ops}
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs():
    return run_child(CHILD, REMOVALS)


@pytest.mark.parametrize("variant", sorted(REMOVALS))
@pytest.mark.engine_run
def test_eagle_variant_is_race_free_as_released(runs, variant):
    run = runs[variant]
    assert run["intact"] == []
    assert run["unknown"] == []  # every raw-pointer kernel on the path is declared
    assert run["forwards"] >= 6 and run["iterations"] >= 12


@pytest.mark.parametrize("variant", sorted(REMOVALS))
@pytest.mark.engine_run
def test_removing_a_spec_v2_sync_races_at_sglang_lines(runs, variant):
    files = REMOVALS[variant][4]
    races = runs[variant]["removed"]
    assert races, f"{variant}: no race without line {runs[variant]['line']}"
    named = {Path(side["file"]).name for race in races for side in (race["first"],
                                                                     race["second"])}
    assert named & set(files), named
