"""Shared fixtures; the trace-DSL helpers are in tests/dsl.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))



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
