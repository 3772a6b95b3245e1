"""``python -m overlap_harness``: the same as the ``overlap-harness`` command."""

from overlap_harness.cli import console_main

console_main()
