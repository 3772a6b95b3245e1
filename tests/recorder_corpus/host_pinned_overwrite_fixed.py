"""The host overwrites a pinned staging buffer only after the async H2D copy has read it.

Twin of host_pinned_overwrite_racy.py: ``copy_stream.synchronize()`` blocks the host until the
copy of ``host_batch`` has completed, so staging the next batch cannot change what it read.
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
    copy_stream.synchronize()
    host_batch.fill_(2.0)  # corpus-site: host_write
    torch.cuda.current_stream().wait_stream(copy_stream)
    corpus_report("host_pinned_overwrite", device_batch.tolist(), [1.0] * N)


if __name__ == "__main__":
    main()
