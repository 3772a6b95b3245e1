"""Two streams write rows of one buffer through index tensors, and the row sets overlap.

Stream ``first`` writes ones into rows 0-4 of ``table``; stream ``second`` writes twos into
rows 4-7. Row 4 is written by both with nothing ordering them (WAW on ``table``, row 4 only):
issue order says it ends as 2.0; with ``second`` running first it ends as 1.0.
The values are device tensors: with Python scalars (``= 1.0``) the race never showed on an
H100 in 10 delayed trials, likely because the scalar is first copied from pageable host memory
on the stream and that copy waits, host included, for the forced delay.
Twin: index_rows_fixed.py gives ``second`` rows 5-7, disjoint from ``first``'s.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

ROWS, WIDTH = 8, 256


def main() -> None:
    table = torch.zeros(ROWS, WIDTH, device="cuda")  # corpus-alloc: table
    rows_first = torch.tensor([0, 1, 2, 3, 4], device="cuda")
    rows_second = torch.tensor([4, 5, 6, 7], device="cuda")
    ones = torch.ones(5, WIDTH, device="cuda")
    twos = torch.full((4, WIDTH), 2.0, device="cuda")
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    first.wait_stream(torch.cuda.current_stream())
    second.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(first):
        corpus_delay(first, 5000)
        table[rows_first] = ones  # corpus-site: write_first
    with torch.cuda.stream(second):
        table[rows_second] = twos  # corpus-site: write_second
    torch.cuda.current_stream().wait_stream(first)
    torch.cuda.current_stream().wait_stream(second)
    row_values = table[:, 0].tolist()
    corpus_report("index_rows", row_values, [1.0] * 4 + [2.0] * 4)


if __name__ == "__main__":
    main()
