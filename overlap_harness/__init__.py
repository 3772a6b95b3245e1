"""overlap-harness: the command line that wires scenarios, the protocol model and devices."""

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path as _Path

# The build maps the repository's model/, sim/, gpu_check/, scenarios/, reports/ and recorder/
# folders under this package (pyproject.toml, [tool.setuptools.package-dir]). Run from a
# source tree that was never installed (the GPU machine), the same names resolve from the
# repository root: a source checkout is recognised by model/device.py beside this folder, so an
# installed copy never searches site-packages here.
_SOURCE_ROOT = _Path(__file__).resolve().parent.parent
if (_SOURCE_ROOT / "model" / "device.py").is_file() and str(_SOURCE_ROOT) not in __path__:
    __path__.append(str(_SOURCE_ROOT))

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
