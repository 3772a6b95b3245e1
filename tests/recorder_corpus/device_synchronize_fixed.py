"""torch.cuda.synchronize() after the D2H copy was issued, before the host reads.

Twin of device_synchronize_racy.py: the device sync blocks the host until every stream,
the copy stream included, has completed its work.
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
    torch.cuda.synchronize()
    result = host_out.tolist()  # corpus-site: host_read
    corpus_report("device_synchronize", result, [float(i - 5) for i in range(N)])


if __name__ == "__main__":
    main()
