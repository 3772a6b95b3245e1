""".item() on the default stream taken as a sync for a D2H copy on another stream.

``.item()`` blocks the host until the default stream's work is done, but the non-blocking
copy into ``host_out`` runs on the copy stream: the host's read of the pinned buffer is not
ordered after it (host-D2H on ``host_out``).
Twin: blocking_item_fixed.py issues the copy on the default stream, before the ``.item()``.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 896


def main() -> None:
    device_values = torch.arange(N, device="cuda", dtype=torch.float32) * 2
    host_out = torch.zeros(N, pin_memory=True)  # corpus-alloc: host_out
    copy_stream = torch.cuda.Stream()
    copy_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(copy_stream):
        corpus_delay(copy_stream, 5000)
        host_out.copy_(device_values, non_blocking=True)  # corpus-site: d2h
    count = int(device_values.count_nonzero().item())
    result = host_out.tolist()  # corpus-site: host_read
    torch.cuda.current_stream().wait_stream(copy_stream)
    corpus_report("blocking_item", [count, *result], [N - 1] + [2.0 * i for i in range(N)])


if __name__ == "__main__":
    main()
