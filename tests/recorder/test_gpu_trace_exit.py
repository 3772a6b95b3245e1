"""The command line leaves without interpreter teardown once GPU mode has switched torch's GPU
trace on (its hooks cannot be unregistered and fail on every CUDA free during teardown), and
exits normally otherwise."""

from __future__ import annotations

import sys
import types

import pytest

from overlap_harness import cli


class _Left(Exception):
    """Raised in place of os._exit / sys.exit so the test sees which way the process left."""


@pytest.mark.parametrize("traced", [True, False])
def test_console_main_skips_teardown_only_after_gpu_tracing(monkeypatch, traced):
    fake = types.ModuleType("overlap_harness.recorder.gpu_mode")
    fake.trace_active = lambda: traced
    monkeypatch.setitem(sys.modules, "overlap_harness.recorder.gpu_mode", fake)
    monkeypatch.setattr(cli, "main", lambda: 1)

    def os_exit(status: int) -> None:
        raise _Left(("os._exit", status))

    monkeypatch.setattr(cli.os, "_exit", os_exit)
    with pytest.raises((_Left, SystemExit)) as left:
        cli.console_main()
    if traced:
        assert left.value.args == (("os._exit", 1),)
    else:
        assert isinstance(left.value, SystemExit) and left.value.code == 1
