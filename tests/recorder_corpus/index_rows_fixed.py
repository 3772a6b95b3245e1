"""Two streams write disjoint rows of one buffer through index tensors.

Twin of index_rows_racy.py: ``first`` writes rows 0-4 and ``second`` rows 5-7, so no element
is written by both and no order between them is needed (a checker that keys accesses by the
buffer's data pointer would call this a race).
"""

import torch
from corpus_helper import corpus_delay, corpus_report

ROWS, WIDTH = 8, 256


def main() -> None:
    table = torch.zeros(ROWS, WIDTH, device="cuda")  # corpus-alloc: table
    rows_first = torch.tensor([0, 1, 2, 3, 4], device="cuda")
    rows_second = torch.tensor([5, 6, 7], device="cuda")
    ones = torch.ones(5, WIDTH, device="cuda")
    twos = torch.full((3, WIDTH), 2.0, device="cuda")
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
    corpus_report("index_rows", row_values, [1.0] * 5 + [2.0] * 3)


if __name__ == "__main__":
    main()
