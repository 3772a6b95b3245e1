"""No silent pass: an op of unknown access makes the verdict incomplete (``check`` exits 2
unless ``--allow-unknown-ops``; ``watch().complete`` is False), and an API the recorder does not
model is refused in one line (exit 2), also when the program catches the refusal."""

from __future__ import annotations

import contextlib
import textwrap
from pathlib import Path

import pytest
import torch

from overlap_harness.cli import main
from overlap_harness.recorder import RecorderError, declared, watch, writes

RAW_KERNEL = textwrap.dedent("""\
    import torch
    from overlap_harness import declared, writes

    def launch(buf):
        buf.data_ptr()  # a raw kernel writes buf through its pointer (no aten op)

    if "--declared" in __import__("sys").argv:
        launch = declared(lambda out, buf: writes(buf))(launch)
    buf = torch.zeros(4, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch(buf)
    total = buf.sum()
    """)


@pytest.fixture
def raw_kernel(tmp_path: Path) -> Path:
    path = tmp_path / "raw.py"
    path.write_text(RAW_KERNEL)
    return path


def test_an_unknown_op_makes_the_verdict_incomplete(raw_kernel, capsys):
    assert main(["check", "--cpu", str(raw_kernel)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"overlap-harness check: {raw_kernel}: the verdict is incomplete: 1 op "
                      "of unknown access touched watched memory:")
    assert err[1] == f"  data_ptr on side at {raw_kernel}:5, touching buf@raw.py:9"
    assert "declare_kernel" in err[2] and "--allow-unknown-ops" in err[2]


def test_allowed_unknown_ops_exit_as_usual_saying_what_was_not_seen(raw_kernel, capsys):
    # The raw write races the default stream's read, but no access of it was seen.
    assert main(["check", "--cpu", "--allow-unknown-ops", str(raw_kernel)]) == 0
    out = capsys.readouterr().out
    assert f"not seen (--allow-unknown-ops): data_ptr on side at {raw_kernel}:5" in out
    assert "0 races" in out


def test_the_declared_kernel_is_seen_and_its_race_found(raw_kernel, capsys):
    assert main(["check", "--cpu", str(raw_kernel), "--declared"]) == 1
    out = capsys.readouterr().out
    assert f"RAW race on buf (allocated at {raw_kernel}:9)" in out


def test_watch_complete_is_false_while_an_op_is_unknown():
    def launch(buf: torch.Tensor) -> None:
        buf.data_ptr()

    with watch("cpu") as unseen:
        launch(torch.zeros(4, device="cuda"))
    with watch("cpu") as seen:
        declared(lambda out, buf: writes(buf))(launch)(torch.zeros(4, device="cuda"))
    assert (unseen.complete, len(unseen.unknown_ops)) == (False, 1)
    assert (seen.complete, seen.unknown_ops) == (True, [])


REFUSED = {
    "generator": ('g = torch.Generator(device="cuda")',
                  'torch.Generator(device="cuda") in CPU mode is not modelled by the recorder; '
                  "check it in GPU mode (--gpu)"),
    "external_stream": ("s = torch.cuda.ExternalStream(1234)",
                        "torch.cuda.ExternalStream in CPU mode is not modelled by the recorder; "
                        "check it in GPU mode (--gpu)"),
    "event_ipc": ("torch.cuda.Event(interprocess=True).ipc_handle()",
                  "CUDA IPC (Event.ipc_handle) is not modelled by the recorder; check each "
                  "process on its own"),
    "queue": ("__import__('torch.multiprocessing').multiprocessing.Queue().put("
              "[torch.ones(2, device='cuda')])",
              "CUDA IPC (device memory sent to another process) is not modelled by the "
              "recorder; check each process on its own"),
    "failing_function": ("torch.cuda.memory_snapshot()",
                         "torch.cuda.memory_snapshot() in CPU mode (it failed: AttributeError: "
                         "module 'torch._C' has no attribute '_cuda_memorySnapshot') is not "
                         "modelled by the recorder; check it in GPU mode (--gpu)"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
@pytest.mark.parametrize("caught", [False, True])
def test_an_unmodelled_api_is_refused_in_one_line(case, caught, tmp_path, capsys):
    statement, message = REFUSED[case]
    if caught:  # the program swallows the error: still refused
        statement = f"try:\n    {statement}\nexcept Exception:\n    pass"
    path = tmp_path / "prog.py"
    path.write_text(f"import torch\n{statement}\nprint('carried on')\n")
    assert main(["check", "--cpu", str(path)]) == 2
    captured = capsys.readouterr()
    line = 3 if caught else 2
    assert captured.err == f"overlap-harness check: {path}:{line}: {message}\n"
    assert ("carried on" in captured.out) == caught


def test_watch_raises_the_refusal_also_when_the_block_caught_it():
    with (pytest.raises(RecorderError, match="ExternalStream in CPU mode"), watch("cpu"),
          contextlib.suppress(Exception)):
        torch.cuda.ExternalStream(1)
    with watch("cpu") as w:  # a torch.cuda function that works on this build is no refusal
        torch.cuda.empty_cache()
    assert w.complete
