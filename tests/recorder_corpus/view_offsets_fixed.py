"""Two views of one buffer at different offsets that do not overlap.

Twin of view_offsets_racy.py: ``tail`` starts at 600, where ``head`` ends, so the reader
stream never reads an element the writer stream writes.
"""

import torch
from corpus_helper import corpus_delay, corpus_report

SIZE, HEAD_END, TAIL_START = 1024, 600, 600


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
