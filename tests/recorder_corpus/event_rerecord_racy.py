"""A wait issued before an event is re-recorded binds to the earlier record.

The side stream fills ``first_half`` and records ``ready``; the default stream's wait is
issued then, so it binds to that record. The side stream then fills ``second_half`` and
re-records ``ready``, but the wait already issued does not see it: the default stream's read
of ``second_half`` is unordered with its fill (RAW on ``second_half``).
Twin: event_rerecord_fixed.py issues the wait after the re-record.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 1024


def main() -> None:
    first_half = torch.zeros(N, device="cuda")
    second_half = torch.zeros(N, device="cuda")  # corpus-alloc: second_half
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    ready = torch.cuda.Event()
    with torch.cuda.stream(side):
        first_half.fill_(1.0)
        ready.record()
    torch.cuda.current_stream().wait_event(ready)
    with torch.cuda.stream(side):
        corpus_delay(side, 5000)
        second_half.fill_(2.0)  # corpus-site: produce
        ready.record()
    total = first_half + second_half  # corpus-site: consume
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("event_rerecord", total.tolist(), [3.0] * N)


if __name__ == "__main__":
    main()
