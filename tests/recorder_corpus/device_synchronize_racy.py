"""torch.cuda.synchronize() called before the D2H copy it should cover was issued.

The host synchronizes the device and only then issues the non-blocking D2H copy and reads the
pinned buffer: the sync orders nothing after the copy (host-D2H on ``host_out``).
Twin: device_synchronize_fixed.py synchronizes after issuing the copy.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 768


def main() -> None:
    device_values = torch.arange(N, device="cuda", dtype=torch.float32) - 5
    host_out = torch.zeros(N, pin_memory=True)  # corpus-alloc: host_out
    copy_stream = torch.cuda.Stream()
    copy_stream.wait_stream(torch.cuda.current_stream())
    torch.cuda.synchronize()
    with torch.cuda.stream(copy_stream):
        corpus_delay(copy_stream, 5000)
        host_out.copy_(device_values, non_blocking=True)  # corpus-site: d2h
    result = host_out.tolist()  # corpus-site: host_read
    corpus_report("device_synchronize", result, [float(i - 5) for i in range(N)])


if __name__ == "__main__":
    main()
