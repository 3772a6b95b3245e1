"""A worker thread allocates a device tensor on its stream; the main thread's stream waits for
that stream before reading it.

Twin of thread_alloc_racy.py: after ``ready.wait()`` the main thread makes the default stream
wait for ``side``, whose work so far (known to the main thread through the event) includes the
worker's fill.
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
    torch.cuda.current_stream().wait_stream(side)
    total = made[0].sum()  # corpus-site: consume
    worker.join()
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("thread_alloc", [total.item()], [2.0 * N])


if __name__ == "__main__":
    main()
