"""The host overwrites a pinned staging buffer while an async H2D copy may still read it.

The host issues a non-blocking copy of ``host_batch`` to the device and at once stages the
next batch into the same pinned buffer. Host issue order does not order the copy's read
before the host's later write (host-D2H on ``host_batch``): with the copy delayed the
device receives the next batch. Twin: host_pinned_overwrite_fixed.py synchronizes the copy
stream before reusing the buffer.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 1792


def main() -> None:
    host_batch = torch.full((N,), 1.0, pin_memory=True)  # corpus-alloc: host_batch
    device_batch = torch.zeros(N, device="cuda")
    copy_stream = torch.cuda.Stream()
    copy_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(copy_stream):
        corpus_delay(copy_stream, 5000)
        device_batch.copy_(host_batch, non_blocking=True)  # corpus-site: h2d
    host_batch.fill_(2.0)  # corpus-site: host_write
    torch.cuda.current_stream().wait_stream(copy_stream)
    corpus_report("host_pinned_overwrite", device_batch.tolist(), [1.0] * N)


if __name__ == "__main__":
    main()
