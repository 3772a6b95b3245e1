"""A producer and its consumer on two different streams, relying on an order none gives.

The side stream writes ``accum``; the consumer kernel runs on a second stream that never
waits for it (RAW on ``accum``): with the producer delayed the consumer reads zeros.
Twin: stream_fifo_fixed.py issues the consumer on the producer's stream, whose FIFO order
puts it after the producer.
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
    with torch.cuda.stream(consumer):
        squared = accum * accum  # corpus-site: consume
    torch.cuda.current_stream().wait_stream(producer)
    torch.cuda.current_stream().wait_stream(consumer)
    corpus_report("stream_fifo", squared.tolist(), [16.0] * N)


if __name__ == "__main__":
    main()
