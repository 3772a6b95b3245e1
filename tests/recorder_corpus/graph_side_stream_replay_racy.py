"""A CUDA graph replayed on a side stream, its static output read on the default stream.

``graph.replay()`` on ``side`` writes ``static_out`` (the graph's output, in its private
pool); the default stream then reads it without waiting for ``side``: RAW on ``static_out``,
exactly as if the captured kernel had been launched on ``side`` (a replay is ordered only on
the stream it is issued on). With ``side`` delayed the read sees the pool's old contents.
Twin: graph_side_stream_replay_fixed.py makes the default stream wait for ``side`` first.
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
    total = static_out + 1.0  # corpus-site: consume
    torch.cuda.current_stream().wait_stream(side)
    corpus_report("graph_side_stream_replay", total.tolist(), [7.0] * N)


if __name__ == "__main__":
    main()
