"""A tensor used on a side stream, freed after record_stream: its block waits for that use.

Twin of reuse_no_record_stream_racy.py: ``scratch.record_stream(side)`` makes the caching
allocator keep the block until the side stream's work queued so far has completed, so
``fresh`` cannot get it while the side stream still reads it.
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
    scratch.record_stream(side)
    del scratch
    fresh = torch.full((N,), -1.0, device="cuda")  # corpus-site: reuse
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("reuse_no_record_stream", copied.tolist(), [5.0] * N)
    del fresh


if __name__ == "__main__":
    main()
