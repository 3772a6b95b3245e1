"""wait_stream issued before the other stream's work: it waits for nothing that matters.

``wait_stream(side)`` records a fresh event on ``side`` when it is issued, before the side
stream's fill of ``tokens`` exists, so the default stream's read is not ordered after the
fill (RAW on ``tokens``). Twin: wait_stream_issue_time_fixed.py issues it after the fill.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 2048


def main() -> None:
    tokens = torch.zeros(N, device="cuda", dtype=torch.int64)  # corpus-alloc: tokens
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.stream(side):
        corpus_delay(side, 5000)
        tokens.fill_(11)  # corpus-site: produce
    shifted = tokens + 1  # corpus-site: consume
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("wait_stream_issue_time", shifted.tolist(), [12] * N)


if __name__ == "__main__":
    main()
