"""Names in reports: streams, events and tensors are named after the variables their
statement assigns them to, tuple targets included (by position in a tuple of values, or by
output of an op returning several), statements over several lines too."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from overlap_harness.recorder import watch


def variables(w: object) -> set[str]:
    return {label.split("@", 1)[0] for label in w.buffer_sites}  # type: ignore[attr-defined]


def test_tuple_targets_name_each_stream_event_and_output() -> None:
    owner = SimpleNamespace()
    with watch("cpu") as w:
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        e1, e2 = torch.cuda.Event(), torch.cuda.Event()
        owner.side = torch.cuda.Stream()
        a, b = (torch.zeros(2, device="cuda"),
                torch.ones(2, device="cuda"))
        top, where = torch.topk(torch.arange(4.0, device="cuda"), 2)
        values, order = a.sort()
        chained = also = torch.zeros(3, device="cuda")
        held = (b, top, where, values, order)  # alive to the end: no block is reused
    assert (s1.name, s2.name, e1.name, e2.name, owner.side.name) == (
        "s1", "s2", "e1", "e2", "owner.side")
    assert {"a", "b", "top", "where", "values", "order", "chained", "arange"} <= variables(w)
    assert "sort[0]" not in variables(w) and also is chained and len(held) == 5


def test_a_race_names_the_tuple_assigned_streams_and_output() -> None:
    for fixed in (False, True):
        with watch("cpu") as w:
            first, second = torch.cuda.Stream(), torch.cuda.Stream()
            values, order = torch.arange(6.0, device="cuda").sort()
            first.wait_stream(torch.cuda.current_stream())
            second.wait_stream(first)
            with torch.cuda.stream(first):
                order.add_(1)
            if fixed:
                second.wait_stream(first)
            with torch.cuda.stream(second):
                order.mul_(2)
        assert values.shape == order.shape
        found = [(str(r.kind), r.buffer.split("@")[0], r.first.agent, r.second.agent)
                 for r in w.races]
        assert found == ([] if fixed else [("WAW", "order", "first", "second")])


RACY_MODULE = '''
import torch


def racy() -> None:
    """A side-stream write the default stream reads with no ordering (a RAW race)."""
    side = torch.cuda.Stream()
    data = torch.zeros(4, device="cuda")
    with torch.cuda.stream(side):
        data.fill_(1.0)
    data.sum()
'''


def test_a_module_imported_through_a_link_is_named_by_the_link(tmp_path, monkeypatch) -> None:
    """A tree that links its files to an installed copy under the working directory (a
    venv inside the checkout): races name the file as imported, the link, not its target;
    the same program imported from the real file names the real file (its twin)."""
    import importlib.util

    real = tmp_path / "installed" / "program.py"
    real.parent.mkdir()
    real.write_text(RACY_MODULE)
    link = tmp_path / "tree" / "program.py"
    link.parent.mkdir()
    link.symlink_to(real)
    monkeypatch.chdir(tmp_path)

    def race_files(path) -> set[str]:
        spec = importlib.util.spec_from_file_location(f"program_{path.parent.name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        with watch("cpu") as watcher:
            module.racy()
        assert watcher.races
        return {side.source.rsplit(":", 1)[0] for race in watcher.races
                for side in (race.first, race.second)}

    assert race_files(link) == {"tree/program.py"}
    assert race_files(real) == {"installed/program.py"}
