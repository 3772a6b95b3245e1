"""PerThread: an attribute whose value is each thread's own, from a default."""

from __future__ import annotations

import threading

from overlap_harness.recorder.per_thread import PerThread


class Holder:
    level = PerThread(lambda holder: holder.start)

    def __init__(self, start: int) -> None:
        self.start = start


def test_each_thread_sees_its_own_value_from_the_default() -> None:
    holder = Holder(5)
    holder.level = 7
    seen = []

    def other() -> None:
        seen.append(holder.level)  # the default: this thread never set it
        holder.level = 9
        seen.append(holder.level)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == [5, 9]
    assert holder.level == 7  # the other thread's value is its own
    assert Holder(1).level == 1  # and each object's own
