"""Twin of pool_row_index_select_racy.py: the default (schedule) stream waits for the forward
stream's ``index_select`` of row 2 before ``index_copy_`` rewrites that row."""

import torch
from corpus_helper import corpus_delay, corpus_report

ROWS, WIDTH = 4, 512


def main() -> None:
    pool = torch.full((ROWS, WIDTH), 5, dtype=torch.int32, device="cuda")
    rows = torch.tensor([2], device="cuda")
    new_slots = torch.full((1, WIDTH), 7, dtype=torch.int32, device="cuda")
    forward = torch.cuda.Stream()
    forward.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(forward):
        corpus_delay(forward, 5000)
        picked = pool.index_select(0, rows)
    torch.cuda.current_stream().wait_stream(forward)
    pool.index_copy_(0, rows, new_slots)
    corpus_report("pool_row_index_select", picked[0, :4].tolist(), [5] * 4)


if __name__ == "__main__":
    main()
