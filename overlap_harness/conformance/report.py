"""SGLang's own FutureMap beside the model: one row per variant and mutation, JSON and Markdown.

Each row runs the real code under ``recorder.watch(mode="cpu")``
(:mod:`overlap_harness.conformance.driver`)
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
from overlap_harness.scenarios.expand import expand
from overlap_harness.scenarios.loader import load_scenario

ROOT = Path(__file__).resolve().parents[2]
# The report as the conformance package's own CPU shim computed it (before recorder/ took
# over): every row that differs from it says why (:func:`port_note`).
SHIM_BASELINE = ROOT / "reports" / "conformance" / f"sglang-{SGLANG_VERSION}-shim.json"

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


def short_site(site: str) -> str:
    """``sglang/srt/managers/overlap_utils.py:662`` for a site in the installed package."""
    marker = "site-packages/"
    return site.split(marker, 1)[1] if marker in site else site


def race_kinds(keys: Sequence[str]) -> set[str]:
    """The kinds (RAW, WAR, WAW, host-D2H, reuse) of race keys, buffer names left out."""
    return {key.split(" ", 1)[0] for key in keys}


# Why a row's count or kinds changed when the run moved from the conformance package's own
# CPU shim (the committed report before) to recorder.watch(mode="cpu"); verdicts did not.
PORT_NOTES: dict[Mutation | None, str] = {
    Mutation.FORWARD_NO_WAIT: (
        "the recorder also counts the relay buffers' torch.empty at FutureMap creation as a "
        "schedule-stream write (WAW with publish/stash), watches the H2D-copied "
        "req_pool_indices/seq_lens/out_cache_loc by name (the shim's tensor#N) and reports "
        "temporaries freed while the unordered forward still reads them as reuse"),
    Mutation.NO_RECORD_STREAM: (
        "the shim's WAR on a recycled index block is the recorder's reuse kind (allocator "
        "reuse by happens-before); dropping the keep-alive ring frees seq_lens too"),
    Mutation.PUBLISH_READY_WAIT: (
        "the unordered D2H copy also races new_seq_lens_buf's torch.empty on the schedule "
        "stream, which the recorder counts as a write"),
    Mutation.PINNED_EARLY: (
        "the early host read of the pinned mirror is the recorder's host-D2H kind (a host "
        "access of pinned memory racing a copy); the shim called it RAW"),
}


def port_note(mutation: Mutation | None, previous: dict[str, Any] | None, races: int,
              keys: Sequence[str]) -> str | None:
    """How the row differs from the shim-era report ``previous`` (None when it does not)."""
    if previous is None:
        return None
    old_races = previous["races"]
    if old_races == races and race_kinds(previous["race_kinds"]) == race_kinds(keys):
        return None
    old_verdict = "race" if old_races else "race_free"
    new_verdict = "race" if races else "race_free"
    head = f"recorder port: {old_races} -> {races} races"
    if old_verdict != new_verdict:
        return f"{head}, VERDICT CHANGED from {old_verdict} to {new_verdict}"
    why = PORT_NOTES.get(mutation, "the recorder lists every racing pair the shim did not")
    return f"{head}, same verdict: {why}"


def load_previous(path: Path) -> dict[tuple[str, str | None], dict[str, Any]]:
    """Rows of a committed report by (variant, mutation); empty when there is none."""
    if not path.is_file():
        return {}
    rows = json.loads(path.read_text())["rows"]
    return {(row["variant"], row["mutation"]): row for row in rows}


def build_rows(variants: Sequence[str] | None = None,
               previous: dict[tuple[str, str | None], dict[str, Any]] | None = None,
               ) -> list[dict[str, Any]]:
    """Run every variant and applicable mutation on both sides; one row each. ``previous``
    (rows of an earlier report) adds a note to each row whose count or kinds changed."""
    rows = []
    for variant in variants or list(VARIANTS):
        for mutation in applicable(variant):
            outcome = run_variant(variant, mutation)
            model = model_verdict(variant, mutation)
            name = None if mutation is None else str(mutation)
            keys = sorted({r.key for r in outcome.races})
            notes = [explain(variant, mutation, len(outcome.races), model),
                     port_note(mutation, (previous or {}).get((variant, name)),
                               len(outcome.races), keys)]
            rows.append({
                "variant": variant,
                "mutation": name,
                "races": len(outcome.races),
                "race_kinds": keys,
                "sites": sorted({f"{short_site(r.first.source)} / "
                                 f"{short_site(r.second.source)}" for r in outcome.races})[:4],
                "unknown_ops": outcome.unknown_ops,
                "model": model,
                "model_scenario": MODEL_SCENARIO[variant],
                "explanation": "; ".join(n for n in notes if n) or None,
            })
    return rows


def write(rows: list[dict[str, Any]], out_dir: Path, seconds: float) -> tuple[Path, Path]:
    """Write ``sglang-<version>.json`` and ``.md`` under ``out_dir``; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"sglang-{SGLANG_VERSION}"
    doc = {"sglang": SGLANG_VERSION, "driver": "hand-written replay of event_loop_overlap "
           "(Scheduler.run_batch does not import without the server's dependencies)",
           "recorder": "recorder.watch(mode='cpu')",
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
    previous = load_previous(SHIM_BASELINE)
    start = time.perf_counter()
    rows = build_rows(previous=previous)
    return write(rows, out_dir, time.perf_counter() - start)
