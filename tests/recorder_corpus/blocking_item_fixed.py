""".item() on the stream that issued the D2H copy orders the host after the copy.

Twin of blocking_item_racy.py: the non-blocking copy into ``host_out`` is issued on the
default stream, before ``.item()``; the blocking read waits for all earlier work on its stream,
the copy included.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 896


def main() -> None:
    device_values = torch.arange(N, device="cuda", dtype=torch.float32) * 2
    host_out = torch.zeros(N, pin_memory=True)  # corpus-alloc: host_out
    copy_stream = torch.cuda.current_stream()
    with torch.cuda.stream(copy_stream):
        corpus_delay(copy_stream, 5000)
        host_out.copy_(device_values, non_blocking=True)  # corpus-site: d2h
    count = int(device_values.count_nonzero().item())
    result = host_out.tolist()  # corpus-site: host_read
    corpus_report("blocking_item", [count, *result], [N - 1] + [2.0 * i for i in range(N)])


if __name__ == "__main__":
    main()
