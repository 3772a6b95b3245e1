"""A wait on an event issued after the event was recorded.

Twin of wait_unrecorded_event_racy.py: the default stream waits on ``ready`` after the side
stream recorded it behind the fill, so the read of ``values`` is ordered after the fill.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 2048


def main() -> None:
    values = torch.zeros(N, device="cuda")  # corpus-alloc: values
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    ready = torch.cuda.Event()
    with torch.cuda.stream(side):
        corpus_delay(side, 5000)
        values.fill_(7.0)  # corpus-site: produce
        ready.record()
    torch.cuda.current_stream().wait_event(ready)
    tripled = values * 3  # corpus-site: consume
    corpus_report("wait_unrecorded_event", tripled.tolist(), [21.0] * N)


if __name__ == "__main__":
    main()
