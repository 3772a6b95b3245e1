"""The host reads pinned memory before the non-blocking D2H copy into it has landed.

A copy stream copies device values into a pinned buffer with ``non_blocking=True`` (the call
returns at once) and the host reads the buffer without waiting (host-D2H on ``host_out``):
with the copy delayed the host sees the zeros it started with.
Twin: pinned_d2h_host_read_fixed.py synchronizes on the copy's event first.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 1024


def main() -> None:
    device_values = torch.arange(N, device="cuda", dtype=torch.float32) * 3
    host_out = torch.zeros(N, pin_memory=True)  # corpus-alloc: host_out
    copy_stream = torch.cuda.Stream()
    copy_stream.wait_stream(torch.cuda.current_stream())
    copied = torch.cuda.Event()
    with torch.cuda.stream(copy_stream):
        corpus_delay(copy_stream, 5000)
        host_out.copy_(device_values, non_blocking=True)  # corpus-site: d2h
        copied.record()
    result = host_out.tolist()  # corpus-site: host_read
    corpus_report("pinned_d2h_host_read", result, [3.0 * i for i in range(N)])


if __name__ == "__main__":
    main()
