"""Launches and time per call of the kernel variants, on a CUDA GPU.

Variants, each at batch sizes 1, 8, 64 and 256:

* ``gather-unfused`` / ``gather-fused`` / ``gather-triton``: the spec-extras gather
  (model/kernels/gather.py) of topk_p, topk_index, bonus token and hidden states.
* ``draft-slow`` / ``draft-fast``: organize_draft_results vs the topk=1 chain
  (model/kernels/draft_chain.py).

Per variant and batch size it reports:

* kernels/call: GPU kernels seen by torch.profiler (CUPTI) over 10 calls, divided by 10;
  memcpy and memset are not kernels and are not counted.
* device µs: median over the timed calls of CUDA-event time around one call, with the calls
  queued behind a ``torch.cuda._sleep`` so the GPU never waits on the host: kernel time plus
  the device's own gaps between kernels.
* stream µs: the same events with nothing queued ahead: what the stream spends per call when
  the host launches as it goes (launch overhead included).
* host µs/call: wall time to issue the calls back to back, divided by their number.

Every variant's output is checked against its reference before it is timed. Run by hand:

    python benchmarks/kernels.py [--out reports/gpu/kernels.md]

On a machine without CUDA it says so and exits with status 2, measuring nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from overlap_harness.model.kernels.draft_chain import DraftPath, Topk1Chain, organize_draft_results
from overlap_harness.model.kernels.gather import (
    fused_compile_count,
    gather_spec_extras,
    reset_fused_gather,
)

BATCH_SIZES = (1, 8, 64, 256)
VARIANTS = ("gather-unfused", "gather-fused", "gather-triton", "draft-slow", "draft-fast")
WARMUP = 20
CHUNK = 25  # calls queued behind one sleep; small enough not to fill the launch queue
CHUNKS = 8  # 200 timed calls


def count_kernels(fn: Callable[[], object], calls: int = 10) -> float:
    """GPU kernels per call of ``fn``, as CUPTI saw them (memcpy/memset excluded)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [
        e
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and not e.name.lower().startswith(("memcpy", "memset"))
    ]
    return len(kernels) / calls


def time_calls(fn: Callable[[], object]) -> tuple[float, float, float]:
    """(device µs, stream µs, host µs/call): medians of CUDA-event pairs, and issue time."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    n = CHUNK * CHUNKS
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host_us = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()

    def event_medians(queue_behind_sleep: bool) -> float:
        samples = []
        for _ in range(CHUNKS):
            pairs = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(CHUNK)
            ]
            if queue_behind_sleep:  # ~3x the issue time of the chunk, at up to 2 GHz
                torch.cuda._sleep(int(3 * CHUNK * host_us * 2000))
            for start, end in pairs:
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize()
            samples += [start.elapsed_time(end) * 1e3 for start, end in pairs]
        return statistics.median(samples)

    return event_medians(True), event_medians(False), host_us


def gather_case(bs: int, impl: str, args: argparse.Namespace) -> Callable[[], object]:
    gen = torch.Generator(device="cuda").manual_seed(bs)
    pool = args.pool
    topk_p = torch.rand(pool, args.topk, device="cuda", generator=gen)
    topk_index = torch.randint(0, 32000, (pool, args.topk), device="cuda", generator=gen)
    tokens = torch.randint(0, 32000, (pool,), device="cuda", generator=gen)
    hidden = torch.randn(pool, args.hidden, device="cuda", generator=gen, dtype=torch.bfloat16)
    # distinct rows, never the padding row 0, as a real batch's req_pool_indices
    indices = torch.randperm(pool - 1, device="cuda", generator=gen)[:bs] + 1
    bufs = (topk_p, topk_index, tokens, hidden)
    want = gather_spec_extras(indices, *bufs, impl="unfused")
    got = gather_spec_extras(indices, *bufs, impl=impl)
    if not all(torch.equal(a, b) for a, b in zip(got, want, strict=True)):
        raise AssertionError(f"gather {impl} differs from unfused at bs={bs}")
    return lambda: gather_spec_extras(indices, *bufs, impl=impl)


def draft_case(bs: int, path: str, args: argparse.Namespace) -> Callable[[], object]:
    steps = args.steps
    gen = torch.Generator(device="cuda").manual_seed(bs)
    scores = [torch.ones(bs, 1, 1, device="cuda") for _ in range(steps)]
    tokens = [torch.randint(0, 32000, (bs, 1), device="cuda", generator=gen) for _ in range(steps)]
    parents = [torch.tensor([[-1, 0]], device="cuda").repeat(bs, 1)]
    parents += [torch.full((bs, 1), i, device="cuda", dtype=torch.long) for i in range(1, steps)]
    chain = Topk1Chain(steps, steps + 1, max_bs=max(BATCH_SIZES), device="cuda")
    fast = chain.draft(scores, tokens, parents)
    if chain.last_path is not DraftPath.FAST:
        raise AssertionError(f"topk=1 chain did not take the fast path at bs={bs}")
    slow = organize_draft_results(scores, tokens, parents, steps + 1)
    if not all(torch.equal(a, b) for a, b in zip(fast, slow, strict=True)):
        raise AssertionError(f"draft fast path differs from the slow path at bs={bs}")
    if path == "fast":
        return lambda: chain.draft(scores, tokens, parents)
    return lambda: organize_draft_results(scores, tokens, parents, steps + 1)


def fmt_count(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:.2f}"


def run(args: argparse.Namespace) -> tuple[list[dict[str, str]], int]:
    reset_fused_gather()
    rows = []
    for variant in VARIANTS:
        family, kind = variant.split("-")
        for bs in BATCH_SIZES:
            make = gather_case if family == "gather" else draft_case
            fn = make(bs, kind, args)
            kernels = count_kernels(fn)
            device_us, stream_us, host_us = time_calls(fn)
            rows.append({
                "variant": variant,
                "bs": str(bs),
                "kernels/call": fmt_count(kernels),
                "device µs": f"{device_us:.1f}",
                "stream µs": f"{stream_us:.1f}",
                "host µs/call": f"{host_us:.1f}",
            })  # fmt: skip
            print(" | ".join(rows[-1].values()), file=sys.stderr, flush=True)
    return rows, fused_compile_count()


def table(rows: list[dict[str, str]]) -> str:
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r[h] for h in head) + " |" for r in rows]
    return "\n".join(lines)


def report(rows: list[dict[str, str]], compiles: int, args: argparse.Namespace) -> str:
    import triton

    def kernels(variant: str) -> str:
        counts = sorted({r["kernels/call"] for r in rows if r["variant"] == variant}, key=float)
        return "/".join(counts)

    props = torch.cuda.get_device_properties(0)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return "\n".join([
        "# Kernel benchmark (GPU)",
        "",
        f"- device: {props.name}",
        f"- torch: {torch.__version__}",
        f"- triton: {triton.__version__}",
        f"- cuda: {torch.version.cuda}",
        f"- date: {now}",
        f"- command: `{' '.join(['python3', *sys.argv])}`",
        f"- config: P={args.pool} rows, k={args.topk}, H={args.hidden} (bfloat16 hidden), "
        f"draft S={args.steps} N={args.steps + 1} topk=1 max_bs={max(BATCH_SIZES)}; "
        f"{CHUNK * CHUNKS} timed calls after {WARMUP} warm-up",
        f"- fused gather compilations over all batch sizes (graphs built by Inductor, "
        f"counted by the backend): {compiles}",
        f"- kernels/call, fused vs unfused gather: {kernels('gather-fused')} vs "
        f"{kernels('gather-unfused')} (triton: {kernels('gather-triton')})",
        f"- kernels/call, draft fast vs slow: {kernels('draft-fast')} vs "
        f"{kernels('draft-slow')}",
        "",
        "Columns: kernels/call from torch.profiler (memcpy/memset excluded); device µs = median "
        "CUDA-event time per call with calls queued behind a sleep (no host gaps); stream µs = "
        "the same with nothing queued (host launch gaps included); host µs/call = issue time.",
        "",
        table(rows),
        "",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    parser.add_argument("--pool", type=int, default=4097, help="P, rows of each buffer")
    parser.add_argument("--topk", type=int, default=4, help="k, columns of topk_p/index")
    parser.add_argument("--hidden", type=int, default=4096, help="H, hidden-state width")
    parser.add_argument("--steps", type=int, default=3, help="S, draft steps (topk=1)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "benchmarks/kernels.py: no CUDA device here, so nothing was measured; "
            "run it on a machine with a GPU.",
            file=sys.stderr,
        )
        return 2
    rows, compiles = run(args)
    text = report(rows, compiles, args)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
