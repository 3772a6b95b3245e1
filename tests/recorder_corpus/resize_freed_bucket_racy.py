"""A gathered bucket freed by resizing its storage to zero (the FSDP / Megatron idiom), then
grown back for the next gather, while a side stream may still read it.

``bucket`` is filled on the default stream and read by a slow copy on the side stream. The
host frees its block with ``untyped_storage().resize_(0)`` and grows it back with
``resize_(nbytes)`` for the next gather: a new allocation on the default stream, which the
caching allocator serves with the block just freed, so the next gather's write races with the
side stream's read (reuse of ``bucket``'s block): with the read delayed, ``copied`` holds -1
instead of 5. Twin: resize_freed_bucket_fixed.py calls ``bucket.record_stream(side)`` before
the free, as reuse_no_record_stream_fixed.py does before ``del``.
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
    nbytes = bucket.untyped_storage().nbytes()
    bucket.untyped_storage().resize_(0)
    bucket.untyped_storage().resize_(nbytes)
    bucket.fill_(-1.0)  # corpus-site: reuse
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("resize_freed_bucket", copied.tolist(), [5.0] * N)


if __name__ == "__main__":
    main()
