"""SGLang's own FutureMap beside the model: one row per variant and mutation, JSON and Markdown.

Each row runs the real code under the recorder (:mod:`overlap_harness.conformance.driver`)
and the model's scenario of the same variant with the matching sync labels removed (through
:func:`overlap_harness.runner.run_spec`), and explains every disagreement.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from overlap_harness.conformance.driver import VARIANTS, Mutation, run_variant
from overlap_harness.conformance.sglang_env import SGLANG_VERSION
from overlap_harness.runner import run_spec
from scenarios.expand import expand
from scenarios.loader import load_scenario

ROOT = Path(__file__).resolve().parents[2]

# The model's scenario that follows each variant (SCENARIOS.md names them).
MODEL_SCENARIO: dict[str, str] = {
    "non_spec_decode": "scenarios/variants/non_spec_decode.toml",
    "eagle_spec_v2": "scenarios/variants/seq_lens_opt_out.toml",
    "eagle_d2h_stream": "scenarios/protocol/s03_d2h_waits_publish.toml",
    "chunked_prefill": "scenarios/protocol/s19_chunked_prefill_rows.toml",
    "idle_rank": "scenarios/variants/dp_idle_rank.toml",
    "retracted_request": "scenarios/variants/retract_and_chunked.toml",
}
# The model's sync labels (SCENARIOS.md) each mutation of the real code removes.
MODEL_LABELS: dict[Mutation, tuple[str, ...]] = {
    Mutation.FORWARD_NO_WAIT: ("forward_entry",),
    Mutation.WAR_BARRIER: ("war_barrier",),
    Mutation.PUBLISH_READY_WAIT: ("publish_ready.schedule_wait", "publish_ready.d2h_wait"),
    Mutation.PINNED_EARLY: ("d2h.host_sync",),
    Mutation.NO_RECORD_STREAM: ("future_indices.record_stream", "batch_pin_ring"),
}
SPEC_ONLY = {Mutation.PUBLISH_READY_WAIT, Mutation.PINNED_EARLY}  # publish_ready is spec-v2's


def applicable(variant: str) -> list[Mutation | None]:
    """The unmodified run and every mutation whose code the variant reaches."""
    spec = VARIANTS[variant].spec is not None
    return [None, *[m for m in Mutation if spec or m not in SPEC_ONLY]]


def model_verdict(variant: str, mutation: Mutation | None) -> str:
    """The model scenario's computed verdict with the mutation's labels removed."""
    base = expand(load_scenario(ROOT / MODEL_SCENARIO[variant]))[0]
    removed = frozenset(() if mutation is None else MODEL_LABELS[mutation])
    spec = dataclasses.replace(base, removed=removed, allow_unused=True,
                               mutation_name="" if mutation is None else str(mutation))
    result = run_spec(spec)
    if mutation is not None and result.labels_used and not removed & set(result.labels_used):
        return "not_modelled"
    return result.verdict


def explain(variant: str, mutation: Mutation | None, races: int, model: str) -> str | None:
    """Why the real code and the model disagree (None when they agree)."""
    real = "race" if races else "race_free"
    if real == model:
        return None
    if model == "not_modelled":
        return (f"the model's {Path(MODEL_SCENARIO[variant]).stem} never reaches the labels "
                f"{', '.join(MODEL_LABELS[mutation])} (model out of date)" if mutation else None)
    if real == "race_free" and mutation is Mutation.PUBLISH_READY_WAIT:
        return ("SGLang's WAR barrier falls back to schedule_stream.wait_stream(forward_stream) "
                "for EAGLE (the draft-extend runner clears shared_read_done_event), which also "
                "orders the seq_lens gather after publish: the wait is redundant there; the "
                "model's barrier is read_done-grained (model out of date)")
    if real == "race_free" and mutation is Mutation.NO_RECORD_STREAM:
        return ("the coarse WAR barrier (wait_stream on the forward stream) orders the next "
                "allocation after every read of the freed index tensor; the model's barrier "
                "does not (model out of date)")
    if real == "race_free" and mutation is Mutation.WAR_BARRIER:
        return "the variant's forward reads no req_to_token slot the next schedule step rewrites"
    if real == "race" and mutation is Mutation.WAR_BARRIER:
        return ("a row recycled for a new request is rewritten from slot 0 while the last "
                "forward still reads it; the model's scenario recycles no row here")
    if real == "race" and model == "race_free":
        return ("the model scenario has no counterpart of this step (model out of date); "
                "see the races' SGLang file:line")
    return f"real code {real}, model {model}: not explained yet"


def build_rows(variants: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run every variant and applicable mutation on both sides; one row each."""
    rows = []
    for variant in variants or list(VARIANTS):
        for mutation in applicable(variant):
            outcome = run_variant(variant, mutation)
            model = model_verdict(variant, mutation)
            rows.append({
                "variant": variant,
                "mutation": None if mutation is None else str(mutation),
                "races": len(outcome.races),
                "race_kinds": sorted({r.key for r in outcome.races}),
                "sites": sorted({f"{r.first.source} / {r.second.source}"
                                 for r in outcome.races})[:4],
                "model": model,
                "model_scenario": MODEL_SCENARIO[variant],
                "explanation": explain(variant, mutation, len(outcome.races), model),
            })
    return rows


def write(rows: list[dict[str, Any]], out_dir: Path, seconds: float) -> tuple[Path, Path]:
    """Write ``sglang-<version>.json`` and ``.md`` under ``out_dir``; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"sglang-{SGLANG_VERSION}"
    doc = {"sglang": SGLANG_VERSION, "driver": "hand-written replay of event_loop_overlap "
           "(Scheduler.run_batch does not import without the server's dependencies)",
           "recorder": "overlap_harness.conformance.shim (CPU mode)",
           "seconds": round(seconds, 1), "rows": rows}
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# SGLang {SGLANG_VERSION} FutureMap: real code beside the model", "",
             f"Driver: {doc['driver']}. Recorder: {doc['recorder']}. {doc['seconds']} s.", "",
             "| variant | mutation | races | kinds | model | explanation |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['variant']} | {row['mutation'] or '-'} | {row['races']} | "
                     f"{', '.join(row['race_kinds']) or '-'} | {row['model']} | "
                     f"{row['explanation'] or ''} |")
    md_path = out_dir / f"{stem}.md"
    md_path.write_text("\n".join(lines) + "\n")
    return json_path, md_path


def generate(out_dir: Path) -> tuple[Path, Path]:
    """Run everything and write the report; the CLI's entry."""
    start = time.perf_counter()
    rows = build_rows()
    return write(rows, out_dir, time.perf_counter() - start)
