"""A block freed after another stream used it, and the next allocation made on that stream.

Twin of allocator_stream_pool_racy.py: ``fresh`` is allocated on the default stream. The
freed block of ``scratch`` belongs to the side stream's pool, so ``fresh`` gets another block,
and the default stream's own order puts its fill after its read of ``scratch`` anyway.
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
    fresh = torch.full((N,), -3.0, device="cuda")  # corpus-site: reuse
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("allocator_stream_pool", result.tolist(), [9.0] * N)
    del fresh


if __name__ == "__main__":
    main()
