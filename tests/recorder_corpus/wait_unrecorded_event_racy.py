"""A wait on an event that was never recorded: the wait is a no-op.

The default stream waits on ``ready`` before the side stream has recorded it (the wait binds
to no record, as on a first iteration), so the read of ``values`` is not ordered after the
side stream's fill (RAW on ``values``). Twin: wait_unrecorded_event_fixed.py issues the wait
after the record.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 2048


def main() -> None:
    values = torch.zeros(N, device="cuda")  # corpus-alloc: values
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    ready = torch.cuda.Event()
    torch.cuda.current_stream().wait_event(ready)
    with torch.cuda.stream(side):
        corpus_delay(side, 5000)
        values.fill_(7.0)  # corpus-site: produce
        ready.record()
    tripled = values * 3  # corpus-site: consume
    corpus_report("wait_unrecorded_event", tripled.tolist(), [21.0] * N)


if __name__ == "__main__":
    main()
