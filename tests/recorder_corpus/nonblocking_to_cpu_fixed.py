"""A tensor moved to the CPU with non_blocking=True, read after the stream is synchronized.

Twin of nonblocking_to_cpu_racy.py: ``synchronize()`` on the stream that issued the copy
blocks the host until ``on_host`` is filled.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 1280


def main() -> None:
    logits = torch.arange(N, device="cuda", dtype=torch.float32) + 0.5
    corpus_delay(torch.cuda.current_stream(), 5000)
    on_host = logits.to("cpu", non_blocking=True)  # corpus-site: d2h, corpus-alloc: on_host
    torch.cuda.current_stream().synchronize()
    result = on_host.tolist()  # corpus-site: host_read
    corpus_report("nonblocking_to_cpu", result, [i + 0.5 for i in range(N)])


if __name__ == "__main__":
    main()
