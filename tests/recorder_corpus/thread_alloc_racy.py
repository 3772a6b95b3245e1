"""A worker thread allocates a device tensor on its stream and signals it with an Event; the
main thread reads it on the default stream without waiting for that stream.

``fresh`` is allocated and filled by the worker thread (its own host agent; in CPU mode the
allocation is faked like the main thread's) on ``side``; ``threading.Event`` orders the main
thread after the worker's issue of the fill, not after the fill (RAW on ``fresh``): with
``side`` delayed, the sum sees whatever the block held.
Twin: thread_alloc_fixed.py makes the default stream wait for ``side`` after the event.
"""

import threading

import torch
from corpus_helper import corpus_delay, corpus_report

N = 2048


def main() -> None:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    made: list = []
    ready = threading.Event()

    def allocate() -> None:
        with torch.cuda.stream(side):
            corpus_delay(side, 5000)
            fresh = torch.full((N,), 2.0, device="cuda")  # corpus-site: fill, corpus-alloc: fresh
        made.append(fresh)
        ready.set()

    worker = threading.Thread(target=allocate, name="allocator")
    worker.start()
    ready.wait()
    total = made[0].sum()  # corpus-site: consume
    worker.join()
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("thread_alloc", [total.item()], [2.0 * N])


if __name__ == "__main__":
    main()
