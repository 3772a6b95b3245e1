"""overlap-harness: the command line that wires scenarios, the protocol model and devices."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("overlap-harness")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"


def __getattr__(name: str) -> object:
    """``overlap_harness.watch`` / ``check_script``, imported on first use, so that the
    command line starts without importing torch."""
    if name in ("watch", "check_script"):
        import recorder  # deferred: imports torch

        return getattr(recorder, name)
    raise AttributeError(f"module 'overlap_harness' has no attribute {name!r}")
