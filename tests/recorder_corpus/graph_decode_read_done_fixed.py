"""A graph-replayed decode step whose schedule stream waits on the graph's read-done event.

As graph_decode_read_done_racy.py, but the schedule stream waits on ``read_done`` before it
rewrites ``static_ids``: the wait binds to the latest replay's record (none before the first
replay: a no-op), so the rewrite follows the previous replay's gather.
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
            schedule_stream.wait_event(read_done)
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
