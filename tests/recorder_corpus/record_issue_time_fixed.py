"""An event recorded after the work it covers was issued.

Twin of record_issue_time_racy.py: ``ready.record()`` comes after the fill of ``weights`` is
issued, so it captures it and the default stream's wait orders the read after the fill.
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
        corpus_delay(side, 5000)
        weights.fill_(0.5)  # corpus-site: produce
        ready.record()
    torch.cuda.current_stream().wait_event(ready)
    scaled = weights * 4  # corpus-site: consume
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("record_issue_time", scaled.tolist(), [2.0] * N)


if __name__ == "__main__":
    main()
