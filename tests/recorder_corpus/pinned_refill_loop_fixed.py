"""Twin of pinned_refill_loop_racy.py: after each non_blocking copy the host records an event,
and before the next refill of the pinned ``staging`` buffer it synchronizes that event, so
the copy has read the buffer before the host rewrites it (vLLM's synchronize_input_prep
idea)."""

import torch
from corpus_helper import corpus_delay, corpus_report

N, STEPS = 2048, 3


def main() -> None:
    staging = torch.empty(N, pin_memory=True)
    device_inputs = torch.zeros(N, device="cuda")
    totals = torch.zeros(STEPS, device="cuda")
    copied = torch.cuda.Event()
    for step in range(STEPS):
        if step:
            copied.synchronize()
        staging.copy_(torch.full((N,), float(step + 1)))
        corpus_delay(torch.cuda.current_stream(), 5000)
        device_inputs.copy_(staging, non_blocking=True)
        copied.record()
        totals[step : step + 1] = device_inputs.sum(0, keepdim=True)
    corpus_report("pinned_refill_loop", totals.tolist(), [float(N * (k + 1)) for k in range(STEPS)])


if __name__ == "__main__":
    main()
