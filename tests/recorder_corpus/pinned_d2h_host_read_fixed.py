"""The host reads pinned memory after synchronizing on the D2H copy's event.

Twin of pinned_d2h_host_read_racy.py: ``copied.synchronize()`` blocks the host until the copy
has completed, so the host's read of ``host_out`` is ordered after it.
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
    copied.synchronize()
    result = host_out.tolist()  # corpus-site: host_read
    corpus_report("pinned_d2h_host_read", result, [3.0 * i for i in range(N)])


if __name__ == "__main__":
    main()
