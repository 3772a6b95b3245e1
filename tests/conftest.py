"""Shared fixtures; the trace-DSL helpers are in tests/dsl.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import release_ci_guard  # noqa: E402  (ROOT first on sys.path)


def pytest_configure(config: pytest.Config) -> None:
    """CI's guard on the release matrices: a skipped ``release_ci`` test fails where CI says
    so (tests/release_ci_guard.py)."""
    if not config.pluginmanager.has_plugin("tests.release_ci_guard"):
        config.pluginmanager.register(release_ci_guard, "tests.release_ci_guard")


@pytest.fixture
def dev():
    """A simulated device with 1 µs launch cost, so times are easy to read. (Imported here:
    the GPU machine runs its tests without simpy.)"""
    from overlap_harness.sim.sim_device import SimDevice

    return SimDevice(host_launch_us=1.0)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run that collected no test fails (exit 1), so exit code 5 can never pass silently."""
    if session.testscollected == 0 and exitstatus in (0, 5):
        session.exitstatus = 1
    _FINAL_STATUS.append(int(session.exitstatus))


_FINAL_STATUS: list[int] = []


def pytest_unconfigure(config: pytest.Config) -> None:
    """Triton's bindings (imported by the SGLang and recorder tests) print hundreds of
    reference-leak lines while the interpreter tears down, after pytest's summary, so a log's
    last line would not be the summary CI reads. Once triton is loaded, the main process
    leaves at once with the session's status (everything is written and flushed by now);
    xdist workers, runs without triton and a caller of ``pytest.main`` that sets
    OVERLAP_HARNESS_KEEP_PROCESS (tools/sglang_kernels_report.py) end normally. The same after
    a GPU-mode recording, whose trace hooks fail on every CUDA free during teardown."""
    gpu_mode = sys.modules.get("overlap_harness.recorder.gpu_mode")
    traced = gpu_mode is not None and gpu_mode.trace_active()  # see cli.console_main
    if (("triton" in sys.modules or traced) and _FINAL_STATUS
            and "PYTEST_XDIST_WORKER" not in os.environ
            and "OVERLAP_HARNESS_KEEP_PROCESS" not in os.environ):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_FINAL_STATUS[-1])
