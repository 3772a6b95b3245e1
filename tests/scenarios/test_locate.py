"""The line a problem's key path is on (issue 19: file, line and key in every message)."""

from __future__ import annotations

import textwrap

from overlap_harness.scenarios.locate import KeyLocator

TEXT = textwrap.dedent("""\
    name = "x"
    [protocol]
    war_barrier = "loop-top"

    [workload]
    iterations = 4
    requests = [
      { id = "A", arrive = 0, prompt_len = 12, max_new = 10 },
      { id = "B", arrive = 1, prompt_len = 5, max_new = 3 },
    ]

    [[mutation]]
    remove = ["war_barrier"]

    [[mutation]]
    remove = ["forward_entry"]
    set = { war_barrier = "none" }
    """)


def test_each_kind_of_key_path_is_placed_on_its_line() -> None:
    locate = KeyLocator(TEXT).line
    assert locate("name") == 1
    assert locate("protocol.war_barrier") == 3
    assert locate("protocol") == 2
    assert locate("workload.iterations") == 6
    assert locate("workload.requests[0].max_new") == 8
    assert locate("workload.requests[1].id") == 9
    assert locate("mutation[0].remove[0]") == 13
    assert locate("mutation[1].remove[0]") == 16
    assert locate("mutation[1].set.war_barrier") == 17


def test_a_key_the_file_lacks_falls_back_to_its_table_or_to_nothing() -> None:
    locate = KeyLocator(TEXT).line
    assert locate("protocol.topk") == 2  # a rule about a default value: its table
    assert locate("timing.jitter") is None  # no [timing] table at all
    assert locate("nothing_here") is None
