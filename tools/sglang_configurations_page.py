"""Write docs/sglang-configurations.md from the SGLang variants' features.

``python tools/sglang_configurations_page.py`` (no SGLang needed): the configuration keys and
the variants that run each value, the features and the SGLang options each drives, and the
options known and not driven with the reason (overlap_harness/engines/sglang/coverage.py).
``--check`` exits 1 when the committed page differs (what the test checks).
"""

from __future__ import annotations

import sys
from pathlib import Path

from overlap_harness.engines.sglang.coverage import PAGE, markdown

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    """Write the page (or, with ``--check``, compare it); exit status."""
    page = ROOT / PAGE
    text = markdown()
    if "--check" in argv:
        if page.read_text() != text:
            print(f"{PAGE} is out of date: run python tools/sglang_configurations_page.py")
            return 1
        return 0
    page.write_text(text)
    print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
