"""A buffer overwritten on the default stream while a side stream may still be reading it.

The side stream reads ``kv_slots`` to build ``doubled``; the default stream then writes the
next step's slots into the same buffer without waiting for that read (WAR on ``kv_slots``):
with the read delayed it sees the new slots. This is the write-after-read barrier an overlap
scheduler needs. Twin: write_after_read_fixed.py waits for the side stream before the write.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 2304


def main() -> None:
    kv_slots = torch.arange(N, device="cuda", dtype=torch.int64)  # corpus-alloc: kv_slots
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        corpus_delay(side, 5000)
        doubled = kv_slots * 2  # corpus-site: read
    kv_slots.fill_(-1)  # corpus-site: overwrite
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("write_after_read", doubled.tolist(), [2 * i for i in range(N)])


if __name__ == "__main__":
    main()
