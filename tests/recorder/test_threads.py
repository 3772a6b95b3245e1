"""Host threads (STREAM-SEMANTICS.md "host threads"): each thread's CUDA work recorded as a
host agent of its own, ordered to other threads only by Thread.start / join, Queue put -> get,
Event set -> wait, Lock release -> acquire, ThreadPoolExecutor submit -> result. Each ordering
has a twin without it, where the detector must find the race; what cannot be modelled is
refused in one line."""

from __future__ import annotations

import contextlib
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from overlap_harness.recorder import RecorderError, watch


def _kinds(w) -> list[str]:
    return sorted(str(r.kind) for r in w.races)


def _side_add(buf: torch.Tensor, side, synced: bool) -> None:
    """A side-stream write the calling thread's host waits for when ``synced``."""
    with torch.cuda.stream(side):
        buf.add_(1.0)
    if synced:
        side.synchronize()


@pytest.mark.parametrize("synced", [True, False])
def test_join_orders_what_the_thread_synchronized(synced: bool) -> None:
    with watch("cpu") as w:
        buf = torch.zeros(8, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        worker = threading.Thread(target=_side_add, args=(buf, side, synced), name="loader")
        worker.start()
        worker.join()
        total = buf.sum()
    assert total.item() == 8.0
    assert _kinds(w) == ([] if synced else ["RAW"])
    if not synced:
        (race,) = w.races
        assert race.first.op_name == "add_ [thread loader]" and race.first.agent == "side"


@pytest.mark.parametrize("synced_before_start", [True, False])
def test_start_orders_the_parents_past(synced_before_start: bool) -> None:
    with watch("cpu") as w:
        buf = torch.zeros(8, device="cuda")
        buf.fill_(2.0)  # on the default stream
        side = torch.cuda.Stream()
        if synced_before_start:
            torch.cuda.synchronize()
        worker = threading.Thread(target=_side_add, args=(buf, side, True))
        worker.start()
        worker.join()
        if not synced_before_start:
            torch.cuda.synchronize()
    assert sorted(set(_kinds(w))) == ([] if synced_before_start else ["WAW"])


@pytest.mark.parametrize("locked", [True, False])
def test_lock_release_orders_the_next_acquire(locked: bool) -> None:
    with watch("cpu") as w:
        buf = torch.zeros(8, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        lock = threading.Lock()
        done: queue.SimpleQueue = queue.SimpleQueue()  # sequences the threads, orders nothing

        def work() -> None:
            with lock:
                _side_add(buf, side, True)
            done.put(True)

        worker = threading.Thread(target=work)
        worker.start()
        done.get()
        if locked:
            with lock:
                total = buf.sum()
        else:
            total = buf.sum()
        worker.join()
    assert total.item() == 8.0
    assert _kinds(w) == ([] if locked else ["RAW"])


@pytest.mark.parametrize("synced", [True, False])
def test_executor_result_orders_the_task(synced: bool) -> None:
    with watch("cpu") as w:
        buf = torch.zeros(8, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(_side_add, buf, side, synced).result()
            total = buf.sum()
    assert total.item() == 8.0
    assert _kinds(w) == ([] if synced else ["RAW"])


def test_each_thread_has_its_own_current_stream() -> None:
    seen = []
    with watch("cpu"):
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            worker = threading.Thread(target=lambda: seen.append(torch.cuda.current_stream()))
            worker.start()
            worker.join()
            seen.append(torch.cuda.current_stream())
    assert [s.name for s in seen] == ["default", "side"]


def test_a_stream_two_threads_use_unordered_is_refused() -> None:
    go: queue.SimpleQueue = queue.SimpleQueue()  # sequences the threads, orders nothing
    with pytest.raises(RecorderError, match="stream 'default' used by two threads"), watch("cpu"):
        buf = torch.zeros(8, device="cuda")
        def add_after_go() -> None:
            go.get()
            with contextlib.suppress(RecorderError):  # kept by the watch, raised at its end
                buf.add_(1.0)

        worker = threading.Thread(target=add_after_go)
        worker.start()
        buf.mul_(2.0)  # the default stream, issued by the main thread after the start
        go.put(True)
        worker.join()


def test_a_thread_started_before_the_watch_is_refused() -> None:
    go, done = threading.Event(), threading.Event()
    errors = []

    def late() -> None:
        go.wait()
        try:
            torch.cuda.Event().record()
        except RecorderError as exc:
            errors.append(str(exc))
        done.set()

    worker = threading.Thread(target=late, name="early")
    worker.start()
    with pytest.raises(RecorderError, match="CUDA work of thread 'early', started before"), \
            watch("cpu"):
        go.set()
        done.wait()
    worker.join()
    assert len(errors) == 1


def test_threads_past_the_agent_limit_are_refused() -> None:
    def work() -> None:
        torch.zeros(2, device="cuda").add_(1.0)

    with pytest.raises(RecorderError, match=r"thread 'w14' \(more host threads and streams"), \
            watch("cpu"):
        for number in range(20):
            worker = threading.Thread(target=work, name=f"w{number}")
            worker.start()
            worker.join()


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_a_refused_thread_does_not_leave_check_waiting(tmp_path, sigint) -> None:
    """A thread's refusal wakes the main thread blocked on it (a queue here), with SIGINT as
    it is and where it is ignored: started in the background by a non-interactive shell (or
    under nohup) a program ignores SIGINT, and the wake-up was once a SIGINT that then hung
    for good. Each run is a fresh process, as a user's ``check`` is (in the suite's own
    process, after a thousand other tests, it once hung under load: not explained)."""
    import signal
    import subprocess
    import sys

    path = tmp_path / "prog.py"
    path.write_text(
        "import queue, threading\nimport torch\nhandoff = queue.Queue()\n"
        "def work():\n    torch.cuda.ExternalStream(1)\n    handoff.put(1)\n"
        "threading.Thread(target=work).start()\nhandoff.get()\n")
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint == "ignored" \
        else None
    done = subprocess.run(
        [sys.executable, "-m", "overlap_harness", "check", "--cpu", str(path)],
        capture_output=True, text=True, timeout=120, check=False, preexec_fn=ignore)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (
        f"overlap-harness check: {path}:5: torch.cuda.ExternalStream in CPU mode is not "
        "modelled by the recorder; check it in GPU mode (--gpu)\n")


def test_a_thread_torch_starts_in_cpp_counts_as_the_waiting_host() -> None:
    # torch's C++ threads (the autograd engine's device threads) are _DummyThreads to Python;
    # one started by _thread.start_new_thread is one too
    import _thread

    done = threading.Event()

    def foreign() -> None:
        torch.cuda.Event().record()
        done.set()

    with watch("cpu") as w:
        _thread.start_new_thread(foreign, ())
        done.wait()
    assert w.complete and [n.agent for n in w.run.timeline] == ["default"]  # its record
