"""Which packages of one of pyproject.toml's extras are not installed here: a test that needs
an extra (the trees of the vLLM release matrix need the ``vllm`` extra's packages) skips naming
them, rather than failing on an import error in a child process."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def missing_distributions(requirements: list[str]) -> list[str]:
    """The requirements (PEP 508 strings) no installed distribution meets, each as written
    (with the installed version where one is installed but outside the specifier)."""
    missing = []
    for text in requirements:
        requirement = Requirement(text)
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            missing.append(text)
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            missing.append(f"{text} (installed: {version})")
    return missing


def missing_extra(extra: str) -> list[str]:
    """The requirements of this tree's ``extra`` (pyproject.toml) not installed here."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return missing_distributions(project["optional-dependencies"][extra])
