"""An event recorded before the work it is meant to cover was issued.

``ready.record()`` captures the side stream's work enqueued so far, which does not yet
include the fill of ``weights``; the default stream's wait is satisfied without it (RAW on
``weights``): with the fill delayed the default stream reads zeros.
Twin: record_issue_time_fixed.py records after issuing the fill.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 1536


def main() -> None:
    weights = torch.zeros(N, device="cuda")  # corpus-alloc: weights
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    ready = torch.cuda.Event()
    with torch.cuda.stream(side):
        ready.record()
        corpus_delay(side, 5000)
        weights.fill_(0.5)  # corpus-site: produce
    torch.cuda.current_stream().wait_event(ready)
    scaled = weights * 4  # corpus-site: consume
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("record_issue_time", scaled.tolist(), [2.0] * N)


if __name__ == "__main__":
    main()
