"""A CUDA graph replayed on a side stream, its static output read after a wait_stream.

The default stream waits for ``side`` before reading ``static_out``, so the replay's write
happens before the read. Twin of graph_side_stream_replay_racy.py.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 1024


def main() -> None:
    static_in = torch.zeros(N, device="cuda")
    (static_in * 2.0).sum()  # warm-up: each kernel launched once before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = static_in * 2.0  # corpus-alloc: static_out
    static_in.fill_(3.0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        corpus_delay(side, 5000)
        graph.replay()  # corpus-site: replay
    torch.cuda.current_stream().wait_stream(side)
    total = static_out + 1.0  # corpus-site: consume
    corpus_report("graph_side_stream_replay", total.tolist(), [7.0] * N)


if __name__ == "__main__":
    main()
