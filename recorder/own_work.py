"""The recorder's own device work, kept out of the program's trace.

To know which rows an indexing op touches, the recorder reads the op's index tensor on the
host (``recorder.elements``). On a GPU that read is a blocking device-to-host copy, and torch
reports it to the GPU trace hooks as a synchronization of the current stream, exactly like a
``.cpu()`` in the program. Recorded as the program's, it would order the stream's earlier
work before everything the host does next, and hide the races that work has with later host
writes or other streams (GPU mode reported fewer races than CPU mode for this reason). So the
recorder brackets its own reads with :func:`recorder_work`, and the trace hooks ignore what
fires inside (:func:`in_recorder_work`). The depth is per thread: a program thread's syncs
are never hidden by the recorder's work in another thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_DEPTH = threading.local()


@contextmanager
def recorder_work() -> Iterator[None]:
    """Inside: device work the recorder does for itself (not the program's)."""
    _DEPTH.value = getattr(_DEPTH, "value", 0) + 1
    try:
        yield
    finally:
        _DEPTH.value -= 1


def in_recorder_work() -> bool:
    """True while the calling thread is inside :func:`recorder_work`."""
    return getattr(_DEPTH, "value", 0) > 0
