"""The recorder: real PyTorch stream code checked by the happens-before detector.

``watch()`` records a block, ``check_script()`` a whole script; CPU mode fakes CUDA on the
CPU, GPU mode watches real streams. See :mod:`recorder.api`.
"""

from overlap_harness.recorder.api import (
    CheckResult,
    RecorderError,
    Watch,
    check_script,
    iteration,
    watch,
)
from overlap_harness.recorder.kernels import DeclaredAccess, declare_kernel, declared, reads, writes

__all__ = ["CheckResult", "DeclaredAccess", "RecorderError", "Watch", "check_script",
           "declare_kernel", "declared", "iteration", "reads", "watch", "writes"]
