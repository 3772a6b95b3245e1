"""The adapter's error, importable without torch (the command line builds its parser first)."""

from __future__ import annotations

from overlap_harness.model.errors import HarnessError


class TokenSpeedUnavailable(HarnessError):
    """TokenSpeed cannot be imported here, or the tree lacks what the driver builds on."""
