"""The recorder beside torch.compile (recorder/compile_guard.py): the dispatch mode's hook is
kept out of Dynamo without importing ``torch._dynamo`` for programs that never compile, and a
program that does compile still runs its compiled functions to the same values while its
stream races are found (each racy program with its fixed twin; every verdict is the
recorder's)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from overlap_harness.recorder import watch

ROOT = Path(__file__).resolve().parents[2]


def scaled_sum(x: torch.Tensor) -> torch.Tensor:
    return (x * 2 + 1).sin().sum(dim=0)


def program(compiled: object, fixed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The main stream fills ``data``; the side stream runs ``compiled`` on it (ordered
    after the fill only when ``fixed``); returns the compiled result and the eager one."""
    side = torch.cuda.Stream()
    data = torch.zeros(8, 4, device="cuda")
    data.fill_(0.5)
    if fixed:
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        result = compiled(data)
    torch.cuda.current_stream().wait_stream(side)
    return result, scaled_sum(data)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("warmed", [False, True], ids=["first_call_watched", "compiled_before"])
@pytest.mark.parametrize("fixed", [False, True], ids=["racy", "fixed"])
def test_a_compiled_function_beside_a_stream_race(backend: str, warmed: bool,
                                                  fixed: bool) -> None:
    from torch._dynamo.backends.registry import lookup_backend

    graphs: list[str] = []  # the code of every graph Dynamo hands the backend

    def counting(gm: torch.fx.GraphModule, inputs: list) -> object:
        graphs.append(gm.code)
        return lookup_backend(backend)(gm, inputs)

    torch._dynamo.reset()
    compiled = torch.compile(scaled_sum, backend=counting)
    if warmed:  # compiled and cached outside the watch, on plain CPU tensors
        assert torch.allclose(compiled(torch.full((8, 4), 0.5)),
                              scaled_sum(torch.full((8, 4), 0.5)))
    before = len(graphs)
    with watch(mode="cpu") as w:
        result, expected = program(compiled, fixed)
    # Dynamo leaves a program under a dispatch mode to run eagerly, and never compiles the
    # recorder's hook or what it calls (no graph of the recorder's own work)
    assert graphs[before:] == []
    assert torch.allclose(result, expected)
    found = {(str(race.kind), race.first.buffer.split("@")[0]) for race in w.races}
    assert found == (set() if fixed else {("RAW", "data")}), w.races
    with watch(mode="cpu") as eager:  # the same program with the function not compiled
        program(scaled_sum, fixed)
    assert _pairs(w.races) == _pairs(eager.races)


def _pairs(races: list) -> list[tuple[str, str, str]]:
    return [(str(race.kind), race.first.op_name, race.second.op_name) for race in races]


WATCHED_WITHOUT_COMPILE = textwrap.dedent("""\
    import sys
    import torch
    from overlap_harness.recorder import watch

    with watch(mode="cpu") as w:
        side = torch.cuda.Stream()
        data = torch.zeros(4, device="cuda")
        with torch.cuda.stream(side):
            data.add_(1)
        data.sum()
    print(len(w.races) > 0, "torch._dynamo" in sys.modules)
    """)


def test_a_watch_without_torch_compile_does_not_import_dynamo() -> None:
    result = subprocess.run([sys.executable, "-c", WATCHED_WITHOUT_COMPILE], cwd=ROOT,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False"]  # the race found, dynamo not imported
