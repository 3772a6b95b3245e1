"""The delays of the GPU table's trials (GPU clock cycles of ``torch.cuda._sleep``), apart
from the table so that what judges a trial by its delay (gpu/twins.py, gpu/report.py) needs
no more than these numbers."""

from __future__ import annotations

#: a race row's targeted delays (GPU clock cycles of ``torch.cuda._sleep`` before each op of
#: the race's earlier side), tried in turn until a trial shows a wrong value or a crash that
#: made the race: as long as the later side needs
RACE_CYCLES = (1 << 21, 1 << 23, 1 << 25)
#: past :data:`RACE_CYCLES`, one more trial whose delay outlasts the host time the probe
#: measured from the earlier side's op to a reach of the later side that found it finished
#: (``least_done_gap_s``), counted at the fastest clock a Hopper SM runs (about 2 GHz, so the
#: sleep is at least that long), twice over; never longer than this (about a second)
LONGEST_RACE_CYCLES = 1 << 31
FASTEST_CLOCK_HZ = 2.0e9
#: ... nor a trial that would sleep longer than this in all (each earlier op held, at the
#: slowest clock a busy Hopper SM runs, about 1.5 GHz): the row then stays as it is
LONGEST_HELD_S = 90.0
SLOWEST_CLOCK_HZ = 1.5e9
#: a redundant row: each stream the loop holds delayed in turn (before every op it issues)
SWEEP_CYCLES = (1 << 21,)
#: the unmodified loop: each stream in turn at every delay the rows use
CONTROL_CYCLES = tuple(sorted(set(RACE_CYCLES) | set(SWEEP_CYCLES)))
