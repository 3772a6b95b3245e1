"""A buffer overwritten on the default stream after waiting for a side stream's read of it.

Twin of write_after_read_racy.py: the default stream waits for the side stream before it
writes the next step's slots into ``kv_slots``, so the side stream's read sees the old ones.
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
    torch.cuda.current_stream().wait_stream(side)
    kv_slots.fill_(-1)  # corpus-site: overwrite
    corpus_report("write_after_read", doubled.tolist(), [2 * i for i in range(N)])


if __name__ == "__main__":
    main()
