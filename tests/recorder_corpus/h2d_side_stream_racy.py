"""An async H2D copy on a side stream, consumed on the default stream with no wait.

The side stream stages a batch from pinned memory; the default stream doubles it at once. Its
kernel is not ordered after the copy (RAW on ``staged``): with the copy delayed it reads zeros.
Twin: h2d_side_stream_fixed.py waits for the side stream first.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 4096


def main() -> None:
    host_src = torch.arange(N, dtype=torch.float32).pin_memory()
    staged = torch.zeros(N, device="cuda")  # corpus-alloc: staged
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        corpus_delay(side, 5000)
        staged.copy_(host_src, non_blocking=True)  # corpus-site: h2d
    doubled = staged * 2  # corpus-site: consume
    corpus_report("h2d_side_stream", doubled.tolist(), [2.0 * i for i in range(N)])


if __name__ == "__main__":
    main()
