"""overlap-harness: the command line that wires scenarios, the protocol model and devices."""


def __getattr__(name: str) -> object:
    """``overlap_harness.watch`` / ``check_script``, imported on first use, so that the
    command line starts without importing torch."""
    if name in ("watch", "check_script"):
        import recorder  # deferred: imports torch

        return getattr(recorder, name)
    raise AttributeError(f"module 'overlap_harness' has no attribute {name!r}")
