"""Small scenario files for the command-line and plugin tests (a few iterations each)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

#: A race-free base and a mutation that removes the sync S's gather needs, so a race (the
#: §9.2 pair of scenarios/protocol/s02, shortened to 3 iterations).
TWIN = """
name = "twin"
[protocol]
mode = "spec_v2"
war_barrier = "none"
[workload]
iterations = 3
requests = [{ id = "A", prompt_len = 6, max_new = 8 }]
[check]
expect = "race_free"
[[mutation]]
remove = ["publish_ready.schedule_wait"]
expect = "race"
races = ["RAW new_seq_lens_buf"]
"""


def write(folder: Path, name: str, text: str) -> Path:
    """Write a scenario file (dedented) and return its path."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def twin(tmp_path: Path) -> Path:
    """The twin scenario file (one race-free run, one racy run, both as expected)."""
    return write(tmp_path, "twin.toml", TWIN)
