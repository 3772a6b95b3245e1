"""The conformance report's notes on rows that changed since the shim-era report.

Runs without sglang: :func:`port_note` only compares counts and race kinds.
"""

from __future__ import annotations

from overlap_harness.conformance.driver import Mutation
from overlap_harness.conformance.report import port_note, race_kinds, short_site


def test_unchanged_row_has_no_note():
    previous = {"races": 3, "race_kinds": ["RAW new_seq_lens"]}
    assert port_note(None, previous, 3, ["RAW self.new_seq_lens_buf@overlap_utils.py:320"]) is None


def test_count_change_with_the_same_verdict_is_explained():
    previous = {"races": 31, "race_kinds": ["RAW req_to_token"]}
    note = port_note(Mutation.FORWARD_NO_WAIT, previous, 69, ["RAW x", "WAW y"])
    assert note is not None and note.startswith("recorder port: 31 -> 69 races, same verdict")
    assert "torch.empty" in note


def test_kind_change_alone_is_explained():
    previous = {"races": 12, "race_kinds": ["RAW new_seq_lens_cpu_pinned"]}
    note = port_note(Mutation.PINNED_EARLY, previous, 12, ["host-D2H new_seq_lens_cpu_pinned"])
    assert note is not None and "host-D2H" in note


def test_verdict_change_is_flagged():
    previous = {"races": 27, "race_kinds": ["RAW req_to_token"]}
    note = port_note(Mutation.FORWARD_NO_WAIT, previous, 0, [])
    assert note == "recorder port: 27 -> 0 races, VERDICT CHANGED from race to race_free"


def test_no_previous_row_no_note():
    assert port_note(None, None, 5, ["RAW x"]) is None


def test_race_kinds_and_short_site():
    assert race_kinds(["host-D2H a@b.py:1", "RAW c"]) == {"host-D2H", "RAW"}
    site = "/x/lib/python3.11/site-packages/sglang/srt/managers/overlap_utils.py:662"
    assert short_site(site) == "sglang/srt/managers/overlap_utils.py:662"
    assert short_site("overlap_harness/conformance/driver.py:3") == (
        "overlap_harness/conformance/driver.py:3")
