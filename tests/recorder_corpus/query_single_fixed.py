"""An event query polled in a loop before the host reads pinned memory.

Twin of query_single_racy.py: the loop ends only on a True query, so the host's read of
``host_out`` is ordered after the copy, as after ``copied.synchronize()``.
"""

import time

import torch
from corpus_helper import corpus_delay, corpus_report

N = 512


def main() -> None:
    device_values = torch.arange(N, device="cuda", dtype=torch.float32) + 1
    host_out = torch.zeros(N, pin_memory=True)  # corpus-alloc: host_out
    copy_stream = torch.cuda.Stream()
    copy_stream.wait_stream(torch.cuda.current_stream())
    copied = torch.cuda.Event()
    with torch.cuda.stream(copy_stream):
        corpus_delay(copy_stream, 5000)
        host_out.copy_(device_values, non_blocking=True)  # corpus-site: d2h
        copied.record()
    while not copied.query():
        time.sleep(0.0005)
    result = host_out.tolist()  # corpus-site: host_read
    corpus_report("query_single", result, [float(i + 1) for i in range(N)])


if __name__ == "__main__":
    main()
