"""overlap-harness: the command line that wires scenarios, the protocol model and devices."""

import sys as _sys
from importlib.abc import MetaPathFinder as _MetaPathFinder
from importlib.machinery import ModuleSpec as _ModuleSpec
from importlib.metadata import PackageNotFoundError, version
from importlib.util import spec_from_file_location as _spec_from_file_location
from pathlib import Path as _Path

# The build maps the repository's model/, sim/, gpu_check/, scenarios/, reports/ and recorder/
# folders under this package (pyproject.toml, [tool.setuptools.package-dir]).
SOURCE_PACKAGES = ("model", "sim", "gpu_check", "scenarios", "reports", "recorder")


class _SourceTreeFinder(_MetaPathFinder):
    """Run from a source tree that was never installed (the GPU machine), the same names
    resolve from the repository root: ``overlap_harness.<name>`` for the packages of
    :data:`SOURCE_PACKAGES` only, so the root's other folders (tests/, tools/, this package's
    own folder) never become ``overlap_harness.tests`` and the like."""

    def __init__(self, root: _Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> _ModuleSpec | None:
        """The spec of ``overlap_harness.<package>`` in the source tree, else None."""
        parent, _, child = fullname.partition(".")
        if parent != __name__ or child not in SOURCE_PACKAGES:
            return None
        folder = self.root / child
        return _spec_from_file_location(fullname, folder / "__init__.py",
                                        submodule_search_locations=[str(folder)])


# A source checkout is recognised by model/device.py beside this folder, so an installed copy
# never searches site-packages here. The finder goes first: an editable install of another
# checkout must not shadow this one's packages.
_SOURCE_ROOT = _Path(__file__).resolve().parent.parent
if (_SOURCE_ROOT / "model" / "device.py").is_file() and not any(
        isinstance(f, _SourceTreeFinder) and f.root == _SOURCE_ROOT for f in _sys.meta_path):
    _sys.meta_path.insert(0, _SourceTreeFinder(_SOURCE_ROOT))

try:
    __version__ = version("overlap-harness")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"

_RECORDER_NAMES = ("watch", "check_script", "declare_kernel", "declared", "reads", "writes")


def __getattr__(name: str) -> object:
    """``overlap_harness.watch`` / ``check_script`` / ``declare_kernel`` (and ``declared``,
    ``reads``, ``writes``), imported on first use, so that the command line starts without
    importing torch."""
    if name in _RECORDER_NAMES:
        from overlap_harness import recorder  # deferred: imports torch

        return getattr(recorder, name)
    raise AttributeError(f"module 'overlap_harness' has no attribute {name!r}")
