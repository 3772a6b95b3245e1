"""A wait issued after an event was re-recorded binds to the re-record.

Twin of event_rerecord_racy.py: the default stream waits on ``ready`` after the side stream
re-recorded it behind the fill of ``second_half``, so the sum reads both halves filled.
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
    with torch.cuda.stream(side):
        corpus_delay(side, 5000)
        second_half.fill_(2.0)  # corpus-site: produce
        ready.record()
    torch.cuda.current_stream().wait_event(ready)
    total = first_half + second_half  # corpus-site: consume
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("event_rerecord", total.tolist(), [3.0] * N)


if __name__ == "__main__":
    main()
