"""stream.synchronize() on the copy stream before a host read of pinned memory.

Twin of stream_synchronize_racy.py: ``copy_stream.synchronize()`` blocks the host until the
D2H copy issued on it has completed.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 768


def main() -> None:
    device_values = torch.arange(N, device="cuda", dtype=torch.float32) - 5
    host_out = torch.zeros(N, pin_memory=True)  # corpus-alloc: host_out
    copy_stream = torch.cuda.Stream()
    copy_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(copy_stream):
        corpus_delay(copy_stream, 5000)
        host_out.copy_(device_values, non_blocking=True)  # corpus-site: d2h
    copy_stream.synchronize()
    result = host_out.tolist()  # corpus-site: host_read
    corpus_report("stream_synchronize", result, [float(i - 5) for i in range(N)])


if __name__ == "__main__":
    main()
