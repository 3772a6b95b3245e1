"""A loader thread stages each batch on its own stream and hands it over through a queue,
without an event: the consumer's read races the loader's write.

The worker thread (a host agent of its own) adds to ``staged`` on the ``loader_stream`` and puts
it on a ``queue.Queue``; the main thread takes it and reads it on the default stream. The queue
orders the main thread after the worker's *issue* of the add, not after the add itself (RAW on
``staged``): with the loader stream delayed, the sum sees zeros.
Twin: thread_loader_fixed.py records an event after the add, hands it over with the batch,
and the consumer's stream waits on it.
"""

import queue
import threading

import torch
from corpus_helper import corpus_delay, corpus_report

N = 2048


def main() -> None:
    staged = torch.zeros(N, device="cuda")  # corpus-alloc: staged
    loader_stream = torch.cuda.Stream()
    loader_stream.wait_stream(torch.cuda.current_stream())
    handoff: queue.Queue = queue.Queue()

    def load() -> None:
        with torch.cuda.stream(loader_stream):
            corpus_delay(loader_stream, 5000)
            staged.add_(3.0)  # corpus-site: stage
        handoff.put(staged)

    worker = threading.Thread(target=load, name="loader")
    worker.start()
    batch = handoff.get()
    total = batch.sum()  # corpus-site: consume
    worker.join()
    torch.cuda.current_stream().wait_stream(loader_stream)
    corpus_report("thread_loader", [total.item()], [3.0 * N])


if __name__ == "__main__":
    main()
