"""A loader thread hands each batch over through a queue with the event that marks it staged.

Twin of thread_loader_racy.py: the worker records ``ready`` on its stream after the add and
puts it beside the batch; the main thread makes the default stream wait on it before reading
(record -> wait, the record issued before the put, so before the wait).
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
        ready = torch.cuda.Event()
        with torch.cuda.stream(loader_stream):
            corpus_delay(loader_stream, 5000)
            staged.add_(3.0)  # corpus-site: stage
            ready.record()
        handoff.put((staged, ready))

    worker = threading.Thread(target=load, name="loader")
    worker.start()
    batch, ready = handoff.get()
    torch.cuda.current_stream().wait_event(ready)
    total = batch.sum()  # corpus-site: consume
    worker.join()
    torch.cuda.current_stream().wait_stream(loader_stream)
    corpus_report("thread_loader", [total.item()], [3.0 * N])


if __name__ == "__main__":
    main()
