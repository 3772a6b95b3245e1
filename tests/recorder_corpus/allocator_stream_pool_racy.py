"""A block freed after another stream used it is handed to the next allocation on its own stream.

``scratch`` is allocated on the side stream, so its block belongs to the side stream's pool.
The default stream reads it; the host drops it at once, and the next allocation of that size
on the side stream, ``fresh``, gets the block while the default stream may still be reading
it (reuse of ``scratch``'s block): with the read delayed, ``result`` holds -3 instead of 9.
Twin: allocator_stream_pool_fixed.py allocates ``fresh`` on the default stream, whose pool
does not hold the block.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 3584


def main() -> None:
    result = torch.zeros(N, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        scratch = torch.full((N,), 9.0, device="cuda")  # corpus-alloc: scratch
    torch.cuda.current_stream().wait_stream(side)
    corpus_delay(torch.cuda.current_stream(), 5000)
    result.copy_(scratch)  # corpus-site: use
    del scratch
    with torch.cuda.stream(side):
        fresh = torch.full((N,), -3.0, device="cuda")  # corpus-site: reuse
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("allocator_stream_pool", result.tolist(), [9.0] * N)
    del fresh


if __name__ == "__main__":
    main()
