"""An async H2D copy on a side stream, consumed on the default stream after a wait.

Twin of h2d_side_stream_racy.py: the default stream waits for the side stream before it
doubles the staged batch, so its kernel is ordered after the copy.
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
    torch.cuda.current_stream().wait_stream(side)
    doubled = staged * 2  # corpus-site: consume
    corpus_report("h2d_side_stream", doubled.tolist(), [2.0 * i for i in range(N)])


if __name__ == "__main__":
    main()
