"""A single event query treated as a sync before the host reads pinned memory.

The host probes ``copied`` once and, if the copy is not done, sleeps a little and reads the
pinned buffer anyway. The probe can say False: then nothing orders the read after the copy
(host-D2H on ``host_out``). With the copy delayed past the sleep the host reads zeros.
Twin: query_single_fixed.py polls until the query returns True.
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
    if not copied.query():
        time.sleep(0.0005)
    result = host_out.tolist()  # corpus-site: host_read
    corpus_report("query_single", result, [float(i + 1) for i in range(N)])


if __name__ == "__main__":
    main()
