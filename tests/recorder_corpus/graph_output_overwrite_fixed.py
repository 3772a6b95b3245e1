"""The next replay of a CUDA graph waits until another stream has read the previous output.

As graph_output_overwrite_racy.py, but each step begins with the default stream waiting for
the reader, so the next replay's write of ``static_out`` follows the read of the previous
step's output (a replay overwrites its previous outputs: keep what must outlive it ordered).
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 1024
STEPS = 2


def main() -> None:
    static_in = torch.zeros(N, device="cuda")
    (static_in + 1.0).sum()  # warm-up: each kernel launched once before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = static_in + 1.0  # corpus-alloc: static_out
    reader = torch.cuda.Stream()
    kept = []
    for step in range(STEPS):
        torch.cuda.current_stream().wait_stream(reader)
        static_in.fill_(float(10 * step))
        graph.replay()  # corpus-site: replay
        reader.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(reader):
            corpus_delay(reader, 5000)
            kept.append(static_out * 1.0)  # corpus-site: read
    torch.cuda.current_stream().wait_stream(reader)
    corpus_report("graph_output_overwrite", [k.tolist() for k in kept],
                  [[10.0 * step + 1.0] * N for step in range(STEPS)])


if __name__ == "__main__":
    main()
