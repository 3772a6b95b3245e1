"""Two views of one buffer at different offsets overlap; one stream writes, another reads.

``head`` is ``flat[0:600]`` and ``tail`` is ``flat[400:1024]``: they share elements 400-599.
Stream ``writer`` fills ``head`` with 1.0 while stream ``reader`` scales ``tail`` (RAW on
``flat``, elements 400-599): issue order says the shared part reads 1.0; with the fill
delayed it reads 0.0. Twin: view_offsets_fixed.py makes ``tail`` start at 600.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

SIZE, HEAD_END, TAIL_START = 1024, 600, 400


def main() -> None:
    flat = torch.zeros(SIZE, device="cuda")  # corpus-alloc: flat
    head, tail = flat[:HEAD_END], flat[TAIL_START:]
    writer, reader = torch.cuda.Stream(), torch.cuda.Stream()
    writer.wait_stream(torch.cuda.current_stream())
    reader.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(writer):
        corpus_delay(writer, 5000)
        head.fill_(1.0)  # corpus-site: write_head
    with torch.cuda.stream(reader):
        scaled = tail * 10  # corpus-site: read_tail
    torch.cuda.current_stream().wait_stream(reader)
    torch.cuda.current_stream().wait_stream(writer)
    expected = [10.0 if i < HEAD_END else 0.0 for i in range(TAIL_START, SIZE)]
    corpus_report("view_offsets", scaled.tolist(), expected)


if __name__ == "__main__":
    main()
