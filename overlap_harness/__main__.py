"""``python -m overlap_harness``: the same as the ``overlap-harness`` command."""

import sys

from overlap_harness.cli import main

sys.exit(main())
