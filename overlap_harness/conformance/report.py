"""SGLang's own FutureMap beside the model: one row per variant and mutation, JSON and Markdown.

Each row runs the real code under ``recorder.watch(mode="cpu")``
(:mod:`overlap_harness.conformance.driver`) and the model's run that stands for the same
variant and mutation: the ``[[mutation]]`` of that name in the variant's model scenario
(``model_scenarios/sglang_<variant>.toml``), through :func:`overlap_harness.runner.run_spec`;
every disagreement, and every mutation the real run never reached, is explained in the row.
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
from overlap_harness.scenarios.expand import RunSpec, expand
from overlap_harness.scenarios.loader import load_scenario

ROOT = Path(__file__).resolve().parents[2]
# The report as the conformance package's own CPU shim computed it (before recorder/ took
# over): every row that differs from it says why (:func:`port_note`).
SHIM_BASELINE = ROOT / "reports" / "conformance" / f"sglang-{SGLANG_VERSION}-shim.json"
# The model's scenario of each variant: the same requests, steps and protocol keys as the
# driver's variant (SGLang 0.5.23's barrier placement, its D2H path, no CI poison). Each
# mutation of the real code is the scenario's [[mutation]] of the same name: the sync labels
# it removes are the model's counterpart of what the mutation drops in SGLang.
MODEL_SCENARIOS = Path(__file__).resolve().parent / "model_scenarios"
MODEL_SCENARIO: dict[str, Path] = {
    variant: MODEL_SCENARIOS / f"sglang_{variant}.toml" for variant in VARIANTS}
SPEC_ONLY = {Mutation.PUBLISH_READY_WAIT, Mutation.PINNED_EARLY}  # publish_ready is spec-v2's


def applicable(variant: str) -> list[Mutation | None]:
    """The unmodified run and every mutation whose sync the variant's real code reaches:
    ``fwd_prepare_d2h_stream.synchronize()`` only where the pinned mirror is used, SGLang's
    own ``record_stream`` calls only in spec-v2 (``_resolve_spec_extras``) and in mixed
    batches (``mix_running_indices``). ``Outcome.dropped`` confirms it on every run."""
    spec = VARIANTS[variant]
    reached = [m for m in Mutation if spec.spec is not None or m not in SPEC_ONLY]
    if not spec.needs_cpu_seq_lens:
        reached = [m for m in reached if m is not Mutation.PINNED_EARLY]
    if spec.spec is None and not any(step.mixed for step in spec.steps):
        reached = [m for m in reached if m is not Mutation.RECORD_STREAM]
    return [None, *reached]


def model_run(variant: str, mutation: Mutation | None) -> RunSpec | None:
    """The model scenario's run that stands for ``mutation`` (its base run for None); None
    when the scenario has no mutation of that name (the model has no counterpart)."""
    name = "" if mutation is None else str(mutation)
    runs = expand(load_scenario(MODEL_SCENARIO[variant]))
    return next((run for run in runs if run.mutation_name == name), None)


def model_verdict(variant: str, mutation: Mutation | None) -> str:
    """The model's computed verdict for the run that stands for ``mutation``:
    ``not_modelled`` when there is none or the model never reaches a sync it removes."""
    run = model_run(variant, mutation)
    if run is None:
        return "not_modelled"
    result = run_spec(dataclasses.replace(run, allow_unused=True))
    if run.removed and result.labels_used and not run.removed & set(result.labels_used):
        return "not_modelled"
    return result.verdict


def explain(variant: str, mutation: Mutation | None, races: int, model: str,
            dropped: int = 1) -> str | None:
    """Why the real code and the model disagree (None when they agree)."""
    if dropped == 0 and mutation is not None:
        return f"the real run never reached what {mutation} drops: the row tests nothing"
    real = "race" if races else "race_free"
    if real == model:
        return None
    scenario = MODEL_SCENARIO[variant].name
    if model == "not_modelled":
        return (f"the model's {scenario} has no run of {mutation} that reaches the syncs it "
                "removes (model out of date)")
    return (f"real code {real}, model {model} ({scenario}): the model does not follow SGLang "
            "here (model out of date); see the races' SGLang file:line")


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
            notes = [explain(variant, mutation, len(outcome.races), model, outcome.dropped),
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
                "dropped": outcome.dropped,
                "model": model,
                "model_scenario": MODEL_SCENARIO[variant].relative_to(ROOT).as_posix(),
                "explanation": "; ".join(n for n in notes if n) or None,
            })
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Counts over the rows: all, mutation rows, disagreements (a model verdict that is not
    the real code's, ``not_modelled`` included) and ``not_modelled`` mutation rows."""
    mutated = [r for r in rows if r["mutation"] is not None]
    return {
        "rows": len(rows),
        "mutation_rows": len(mutated),
        "disagreements": sum(r["model"] != ("race" if r["races"] else "race_free")
                             for r in rows if r["model"] != "not_modelled"),
        "not_modelled": sum(r["model"] == "not_modelled" for r in mutated),
    }


def write(rows: list[dict[str, Any]], out_dir: Path, seconds: float) -> tuple[Path, Path]:
    """Write ``sglang-<version>.json`` and ``.md`` under ``out_dir``; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"sglang-{SGLANG_VERSION}"
    counts = summarize(rows)
    doc = {"sglang": SGLANG_VERSION, "driver": "hand-written replay of event_loop_overlap "
           "(Scheduler.run_batch does not import without the server's dependencies)",
           "recorder": "recorder.watch(mode='cpu')",
           "seconds": round(seconds, 1), "summary": counts, "rows": rows}
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# SGLang {SGLANG_VERSION} FutureMap: real code beside the model", "",
             f"Driver: {doc['driver']}. Recorder: {doc['recorder']}. {doc['seconds']} s.", "",
             f"Model: the scenarios of overlap_harness/conformance/model_scenarios/. "
             f"{counts['rows']} rows ({counts['mutation_rows']} mutated): the model disagrees "
             f"with the real code on {counts['disagreements']}, does not model "
             f"{counts['not_modelled']}.", "",
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
