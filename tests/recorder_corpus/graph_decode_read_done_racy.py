"""A graph-replayed decode step whose read-done event the schedule stream does not wait on.

As in SGLang's overlapped decode: the forward stream replays a captured step that gathers
rows by the graph's static input ``static_ids``; right after that read, the captured graph
records ``read_done`` (an ``Event(external=True)``, recorded again at each replay). The
schedule stream writes the next step's ids into ``static_ids`` while the forward stream may
still be replaying the previous step. Here it rewrites them without waiting on ``read_done``:
WAR on ``static_ids`` between a replay's gather and the next step's rewrite. With the forward
stream delayed, a step computes with the next step's ids.
Twin: graph_decode_read_done_fixed.py waits on ``read_done`` before each rewrite.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 256
STEPS = 3


def main() -> None:
    table = torch.arange(4 * N, dtype=torch.float32, device="cuda")
    static_ids = torch.zeros(N, dtype=torch.int64, device="cuda")  # corpus-alloc: static_ids
    next_ids = [(torch.arange(N, device="cuda") * (step + 1)) % (4 * N) for step in range(STEPS)]
    forward_stream, schedule_stream = torch.cuda.Stream(), torch.cuda.Stream()
    read_done = torch.cuda.Event(external=True)
    (table[static_ids] * 2.0).sum()  # warm-up: each kernel launched once before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=forward_stream):
        rows = table[static_ids]
        read_done.record()
        logits = rows * 2.0
    results = []
    for step in range(STEPS):
        with torch.cuda.stream(schedule_stream):
            static_ids.copy_(next_ids[step])  # corpus-site: rewrite
        forward_stream.wait_stream(schedule_stream)
        with torch.cuda.stream(forward_stream):
            corpus_delay(forward_stream, 5000)
            graph.replay()  # corpus-site: replay
            results.append(logits.clone())
    torch.cuda.current_stream().wait_stream(forward_stream)
    expected = [[2.0 * ((i * (step + 1)) % (4 * N)) for i in range(N)] for step in range(STEPS)]
    corpus_report("graph_decode_read_done", [r.tolist() for r in results], expected)


if __name__ == "__main__":
    main()
