"""A producer and its consumer issued on one stream: FIFO order runs them in turn.

Twin of stream_fifo_racy.py: the consumer kernel is issued on the producer's stream, and ops
on one stream never overlap, so it reads ``accum`` after the producer's write.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

N = 2560


def main() -> None:
    accum = torch.zeros(N, device="cuda")  # corpus-alloc: accum
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    producer.wait_stream(torch.cuda.current_stream())
    consumer.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(producer):
        corpus_delay(producer, 5000)
        accum.add_(4.0)  # corpus-site: produce
    with torch.cuda.stream(producer):
        squared = accum * accum  # corpus-site: consume
    torch.cuda.current_stream().wait_stream(producer)
    torch.cuda.current_stream().wait_stream(consumer)
    corpus_report("stream_fifo", squared.tolist(), [16.0] * N)


if __name__ == "__main__":
    main()
