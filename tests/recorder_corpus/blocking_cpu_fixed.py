"""A blocking .cpu() on the stream that wrote the tensor.

Twin of blocking_cpu_racy.py: ``.cpu()`` is issued on the side stream, so its copy runs after
the side stream's write of ``scores`` (stream order) and the host waits for that copy.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 640


def main() -> None:
    scores = torch.zeros(N, device="cuda")  # corpus-alloc: scores
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        corpus_delay(side, 5000)
        quarters = torch.arange(N, device="cuda", dtype=torch.float32) / 4
        scores.copy_(quarters)  # corpus-site: produce
        on_host = scores.cpu()  # corpus-site: read_back
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("blocking_cpu", on_host.tolist(), [i / 4 for i in range(N)])


if __name__ == "__main__":
    main()
