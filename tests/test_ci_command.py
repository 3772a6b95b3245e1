"""`.ci/run` runs exactly the README's test command, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)\n```", quick, flags=re.S)
    (test_command,) = [b for b in blocks if "pytest" in b and "pip install" in b]
    commands = [line for line in (ROOT / ".ci/run").read_text().splitlines()
                if line and not line.startswith(("#", "set ", "cd "))]
    assert commands == [test_command]
