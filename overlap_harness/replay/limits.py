"""Time limits of ``gpu-check``'s sanitizer pass (:func:`overlap_harness.replay.suite.sanitize`).

A module of their own so the command line can show the defaults without importing the GPU
suite (and torch) at start-up.
"""

SANITIZER_RUN_S = 10.0  # one run under CSAN, at most (tried twice)
SANITIZER_START_S = 60.0  # a worker's start (torch import, CUDA context), at most
SANITIZER_BUDGET_S = 180.0  # the whole sanitizer pass, at most
SANITIZER_AFTER_DEADLINE_S = 100.0  # with --deadline: the pass ends this long after it
