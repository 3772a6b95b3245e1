"""A blocking .cpu() on the default stream of a tensor the side stream is still writing.

``.cpu()`` blocks the host until the copy is done, and the copy waits for earlier work on its
own stream only: the side stream's write of ``scores`` is not ordered before it (RAW on
``scores``). Twin: blocking_cpu_fixed.py calls ``.cpu()`` on the side stream.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 640


def main() -> None:
    scores = torch.zeros(N, device="cuda")  # corpus-alloc: scores
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        corpus_delay(side, 5000)
        quarters = torch.arange(N, device="cuda", dtype=torch.float32) / 4
        scores.copy_(quarters)  # corpus-site: produce
    on_host = scores.cpu()  # corpus-site: read_back
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("blocking_cpu", on_host.tolist(), [i / 4 for i in range(N)])


if __name__ == "__main__":
    main()
