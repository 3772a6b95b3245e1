"""The README's first screen tells a newcomer what to run: the three things people come for,
one command each, before the Quick start, which starts within the first 45 lines."""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def test_the_quick_start_is_on_the_first_screen() -> None:
    headings = [i for i, line in enumerate(README.splitlines(), 1)
                if line.startswith("## Quick start")]
    assert headings and headings[0] <= 45


def test_the_first_screen_shows_the_three_commands() -> None:
    first_screen = README.split("## Quick start", 1)[0]
    commands = re.findall(r"```sh\n(.*?)\n```", first_screen, flags=re.S)
    lines = [line for block in commands for line in block.splitlines()]
    assert any(line.startswith("overlap-harness check ") for line in lines)
    assert any(line.startswith("overlap-harness sglang --sglang-src ") for line in lines)
    assert "overlap-harness run scenarios/" in lines
