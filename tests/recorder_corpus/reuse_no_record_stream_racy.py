"""A tensor used on a side stream, freed without record_stream, and its block reused.

``scratch`` is allocated on the default stream and read by a slow copy on the side stream.
The host drops it at once; the caching allocator hands its block to the next allocation of
that size on the default stream, ``fresh``, whose fill races with the side stream's read
(reuse of ``scratch``'s block): with the read delayed, ``copied`` holds -1 instead of 5.
Twin: reuse_no_record_stream_fixed.py calls ``scratch.record_stream(side)`` before the free.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 3072


def main() -> None:
    copied = torch.zeros(N, device="cuda")
    scratch = torch.full((N,), 5.0, device="cuda")  # corpus-alloc: scratch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        corpus_delay(side, 5000)
        copied.copy_(scratch)  # corpus-site: use
    del scratch
    fresh = torch.full((N,), -1.0, device="cuda")  # corpus-site: reuse
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("reuse_no_record_stream", copied.tolist(), [5.0] * N)
    del fresh


if __name__ == "__main__":
    main()
