"""Every node names the protocol line that issued it (``model.device.caller_source``), found
once per call site: the lines are read from this file's text, not from the frames."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from overlap_harness.model import device as device_api
from overlap_harness.sim.sim_device import SimDevice

HERE = Path(__file__)


def line_of(marker: str, text: str | None = None) -> int:
    """The 1-based line of ``text`` (this file by default) that ends with ``# marker``."""
    lines = (HERE.read_text() if text is None else text).splitlines()
    found = [i + 1 for i, line in enumerate(lines) if line.rstrip().endswith(f"# {marker}")]
    assert len(found) == 1, (marker, found)
    return found[0]


def sources(dev: SimDevice) -> dict[str, str]:
    """Node name -> its source, for the nodes named ``k*`` / ``record:*`` / ``wait:*``."""
    return {t.name: t.source for t in dev.timeline if t.name[0] in "krw"}


def issue_from_three_lines(dev: SimDevice) -> None:
    s, f = dev.stream("s"), dev.stream("f")
    b = dev.buffer("b", (4,), torch.int64, fill=0)
    e = dev.event("e")
    for name in ("k1", "k2"):
        dev.launch(s, name, lambda: torch.ones(4, dtype=torch.int64), writes=[b])  # site: launch
    dev.record(e, s)  # site: record
    dev.wait_event(f, e)  # site: wait


def test_each_node_names_its_protocol_line_and_one_line_shares_one_string() -> None:
    dev = SimDevice()
    issue_from_three_lines(dev)
    got = sources(dev)
    file = "tests/sim/test_call_sites.py"
    assert got == {"k1": f"{file}:{line_of('site: launch')}",
                   "k2": f"{file}:{line_of('site: launch')}",
                   "record:e": f"{file}:{line_of('site: record')}",
                   "wait:e": f"{file}:{line_of('site: wait')}"}
    assert got["k1"] is got["k2"]  # interned: the nodes of one line share it


def test_a_device_layer_between_the_protocol_and_the_device_is_skipped() -> None:
    class Layered(SimDevice):  # a subclass in this file would count as the protocol...
        pass

    def through_copy(dev: SimDevice) -> None:
        s = dev.stream("s")
        a = dev.buffer("a", (4,), torch.int64, fill=1)
        b = dev.buffer("b", (4,), torch.int64, fill=0)
        dev.copy(s, a, b, non_blocking=True, name="k_copy")  # site: copy

    dev = Layered()
    through_copy(dev)  # copy() itself calls the device's _enqueue: both are sim/ frames
    assert sources(dev)["k_copy"].endswith(f":{line_of('site: copy')}")


def test_a_long_function_made_at_run_time_names_its_late_lines() -> None:
    # the line of an instruction late in a long function (a 300-line protocol step)
    body = "\n".join(f"    x{i} = {i}" for i in range(300))
    text = (f"def step(dev, s, b):\n{body}\n"
            "    dev.launch(s, 'k_late', lambda: x299 + 0 * b.numel, writes=[b])  # late\n")
    namespace: dict = {}
    exec(compile(text, "<long protocol>", "exec"), namespace)
    dev = SimDevice()
    s = dev.stream("s")
    b = dev.buffer("b", (1,), torch.int64, fill=0)
    for _ in range(2):
        namespace["step"](dev, s, b)
    late = f"<long protocol>:{line_of('late', text)}"
    assert [t.source for t in dev.timeline if t.name == "k_late"] == [late, late]


def test_the_call_sites_start_afresh_past_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_api, "_SOURCES_KEPT", 2)
    monkeypatch.setattr(device_api, "_SOURCES", {})  # this test's own, put back after it
    monkeypatch.setattr(device_api, "_CODES", {})
    dev = SimDevice()
    issue_from_three_lines(dev)
    issue_from_three_lines(dev)
    assert len(device_api._SOURCES) <= 2 and len(device_api._CODES) <= 2
    file = "tests/sim/test_call_sites.py"
    assert [t.source for t in dev.timeline if t.name == "wait:e"] == \
        [f"{file}:{line_of('site: wait')}"] * 2
