"""wait_stream issued after the other stream's work: it orders what follows after it.

Twin of wait_stream_issue_time_racy.py: the default stream's ``wait_stream(side)`` comes
after the fill of ``tokens`` is issued, so the read is ordered after the fill.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 2048


def main() -> None:
    tokens = torch.zeros(N, device="cuda", dtype=torch.int64)  # corpus-alloc: tokens
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        corpus_delay(side, 5000)
        tokens.fill_(11)  # corpus-site: produce
    torch.cuda.current_stream().wait_stream(side)
    shifted = tokens + 1  # corpus-site: consume
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("wait_stream_issue_time", shifted.tolist(), [12] * N)


if __name__ == "__main__":
    main()
