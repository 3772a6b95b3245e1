"""A request-pool row read through ``index_select`` on the forward stream while the schedule
stream (the default one) rewrites that row for the next request.

``pool`` holds one row of token slots per request. The forward stream gathers row 2 with
``index_select`` (its row index a device tensor); the default stream then writes a new
request's slots into row 2 with ``index_copy_`` without waiting for the forward stream (WAR on
``pool``, row 2 only): with the forward stream late, it gathers the new request's slots.
Twin: pool_row_index_select_fixed.py makes the default stream wait for the forward stream
before the rewrite.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

ROWS, WIDTH = 4, 512


def main() -> None:
    pool = torch.full((ROWS, WIDTH), 5, dtype=torch.int32, device="cuda")  # corpus-alloc: pool
    rows = torch.tensor([2], device="cuda")
    new_slots = torch.full((1, WIDTH), 7, dtype=torch.int32, device="cuda")
    forward = torch.cuda.Stream()
    forward.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(forward):
        corpus_delay(forward, 5000)
        picked = pool.index_select(0, rows)  # corpus-site: read_row
    pool.index_copy_(0, rows, new_slots)  # corpus-site: rewrite
    torch.cuda.current_stream().wait_stream(forward)
    corpus_report("pool_row_index_select", picked[0, :4].tolist(), [5] * 4)


if __name__ == "__main__":
    main()
