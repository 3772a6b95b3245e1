"""A persistent pinned staging buffer refilled in place every step while the previous step's
non_blocking H2D copy from it may not have run yet.

Each step the host writes the step's inputs into ``staging`` (pinned) and issues a
non_blocking copy of it to the device, then a kernel that sums the copy. Nothing orders step
k's copy (a device read of ``staging``) before the host's refill in step k+1 (host-D2H on
``staging``): with the copy stream late, a step's copy reads the next step's inputs.
Twin: pinned_refill_loop_fixed.py records an event after each copy and has the host
synchronize it before the next refill.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N, STEPS = 2048, 3


def main() -> None:
    staging = torch.empty(N, pin_memory=True)  # corpus-alloc: staging
    device_inputs = torch.zeros(N, device="cuda")
    totals = torch.zeros(STEPS, device="cuda")
    for step in range(STEPS):
        staging.copy_(torch.full((N,), float(step + 1)))  # corpus-site: refill
        corpus_delay(torch.cuda.current_stream(), 5000)
        device_inputs.copy_(staging, non_blocking=True)  # corpus-site: h2d
        totals[step : step + 1] = device_inputs.sum(0, keepdim=True)
    corpus_report("pinned_refill_loop", totals.tolist(), [float(N * (k + 1)) for k in range(STEPS)])


if __name__ == "__main__":
    main()
