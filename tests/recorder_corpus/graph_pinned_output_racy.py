"""A CUDA graph that copies its output to pinned host memory, read by the host unsynchronized.

The captured step ends with a non-blocking D2H copy of ``static_out`` into the pinned buffer
``host_out`` and records ``copied``. Each replay re-does that copy; the host reads
``host_out`` right after issuing the replay, without waiting for ``copied``: host-D2H on
``host_out`` (the host may read the previous replay's result, or a half-landed copy). With
the replay delayed, the host reads the previous step's values.
Twin: graph_pinned_output_fixed.py synchronizes on ``copied`` before the read.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 512
STEPS = 3


def main() -> None:
    static_in = torch.zeros(N, device="cuda")
    host_out = torch.zeros(N, pin_memory=True)  # corpus-alloc: host_out
    copied = torch.cuda.Event(external=True)
    host_out.copy_(static_in + 1.0, non_blocking=True)  # warm-up: each kernel launched once
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = static_in + 1.0
        host_out.copy_(static_out, non_blocking=True)
        copied.record()
    results = []
    for step in range(STEPS):
        static_in.fill_(10.0 * (step + 1))
        corpus_delay(torch.cuda.current_stream(), 5000)
        graph.replay()  # corpus-site: replay
        results.append(host_out.tolist())  # corpus-site: host_read
    corpus_report("graph_pinned_output", results,
                  [[10.0 * (step + 1) + 1.0] * N for step in range(STEPS)])


if __name__ == "__main__":
    main()
