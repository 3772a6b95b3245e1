"""A tensor moved to the CPU with non_blocking=True and read before the copy lands.

``.to("cpu", non_blocking=True)`` returns at once with a pinned host tensor that the D2H copy
fills later; reading it straight away races with the copy (host-D2H on ``on_host``).
Twin: nonblocking_to_cpu_fixed.py synchronizes the stream first.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 1280


def main() -> None:
    logits = torch.arange(N, device="cuda", dtype=torch.float32) + 0.5
    corpus_delay(torch.cuda.current_stream(), 5000)
    on_host = logits.to("cpu", non_blocking=True)  # corpus-site: d2h, corpus-alloc: on_host
    result = on_host.tolist()  # corpus-site: host_read
    corpus_report("nonblocking_to_cpu", result, [i + 0.5 for i in range(N)])


if __name__ == "__main__":
    main()
