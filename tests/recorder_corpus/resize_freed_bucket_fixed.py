"""A gathered bucket freed by resizing its storage to zero, after record_stream: its block
waits for the side stream's read.

Twin of resize_freed_bucket_racy.py: ``bucket.record_stream(side)`` makes the caching
allocator keep the block freed by ``resize_(0)`` until the side stream's work queued so far
has completed, so growing the storage back cannot get it while the side stream still reads it.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 3072


def main() -> None:
    copied = torch.zeros(N, device="cuda")
    shard = torch.full((N,), 5.0, device="cuda")
    bucket = torch.empty(N, device="cuda")  # corpus-alloc: bucket
    bucket.copy_(shard)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        corpus_delay(side, 5000)
        copied.copy_(bucket)  # corpus-site: use
    bucket.record_stream(side)
    nbytes = bucket.untyped_storage().nbytes()
    bucket.untyped_storage().resize_(0)
    bucket.untyped_storage().resize_(nbytes)
    bucket.fill_(-1.0)  # corpus-site: reuse
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("resize_freed_bucket", copied.tolist(), [5.0] * N)


if __name__ == "__main__":
    main()
