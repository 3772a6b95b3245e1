"""The loop report: each SGLang sync site removed from the real loop, beside the model's removal.

For every variant and sync site of the necessity table (the real ``event_loop_overlap`` with
that one statement removed, :mod:`overlap_harness.engines.core.necessity`), the model runs the
variant's scenario (``conformance/model_scenarios/sglang_loop_<variant>.toml``: the same
arrivals, SGLang 0.5.23's protocol keys) with the model's counterpart of that site removed:
the sync labels of :data:`SITE_LABELS`, matched on the site's file and code, not its line, so
a moved line keeps its counterpart. Every row explains itself: the labels the model's run
removed where it agrees, the reason where it does not. A site with no counterpart is
``not_modelled``, and so is one whose labels the model's run never reaches; rows the real
loop never reaches are not compared (their model column says ``not_modelled``). Known
reasons for a disagreement or a missing counterpart go in :data:`EXPLANATIONS` (for SGLang
0.5.23: the grammar tree's host copy, which has no counterpart).

Computing the model column needs no SGLang, so a test recomputes it from the committed report
and fails when the model parts from the real verdicts recorded there.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from overlap_harness.engines.sglang.report import site_configs
from overlap_harness.runner import run_spec
from overlap_harness.scenarios.expand import expand
from overlap_harness.scenarios.loader import load_scenario

MODEL_SCENARIOS = Path(__file__).resolve().parents[3] / "conformance" / "model_scenarios"

#: (file name, a piece of the statement's code, the model's sync labels removed for it), or
#: (file name, function, code piece, labels) where the same code stands in several functions
#: for different mechanisms: ``function`` is the enclosing function's name (its qualified
#: name's last part, or the whole qualified name). The first entry that matches wins, so the
#: entries naming a function come before a plain entry with the same code.
SiteLabel = tuple[str, str, tuple[str, ...]] | tuple[str, str, str, tuple[str, ...]]
SITE_LABELS: tuple[SiteLabel, ...] = (
    # the same waits on publish_ready in the spec-v2 lengths resolve and the mixed tails
    ("overlap_utils.py", "resolve_seq_lens_cpu", "publish_ready.synchronize()",
     ("publish_ready.host_wait",)),
    ("overlap_utils.py", "resolve_seq_lens_cpu", "publish_ready.wait()",
     ("publish_ready.schedule_wait",)),
    ("overlap_utils.py", "resolve_seq_lens_cpu", "fwd_prepare_d2h_stream.wait_event(",
     ("publish_ready.d2h_wait",)),
    ("overlap_utils.py", "resolve_mixed_spec_tails", "publish_ready.synchronize()",
     ("mixed_tails.host_wait",)),
    ("overlap_utils.py", "resolve_mixed_spec_tails", "publish_ready.wait()",
     ("mixed_tails.forward_wait",)),
    ("overlap_utils.py", "resolve_mixed_spec_tails", "fwd_prepare_d2h_stream.wait_event(",
     ("mixed_tails.d2h_wait",)),
    # the host's wait on the D2H stream: one model label for both functions' copies
    ("overlap_utils.py", "resolve_seq_lens_cpu", "fwd_prepare_d2h_stream.synchronize()",
     ("d2h.host_sync",)),
    ("overlap_utils.py", "resolve_mixed_spec_tails", "fwd_prepare_d2h_stream.synchronize()",
     ("d2h.host_sync",)),
    # an idle batch's wait (an attention-DP rank), apart from prefill's and decode's
    ("batch_result_processor.py", "process_batch_result_idle", "copy_done.synchronize()",
     ("copy_done.idle_host_sync",)),
    # the grammar barrier's host wait (spec v2, grammar_eagle_topk1) and the delayed
    # sampler's forward entry (delay_sample): the model has neither path, so they have no
    # counterpart (not_modelled) rather than the generic host wait / forward entry
    ("batch_result_processor.py", "advance_grammar_fsm", "copy_done.synchronize()", ()),
    ("scheduler.py", "launch_batch_sample_if_needed",
     "forward_stream.wait_stream(self.schedule_stream)", ()),
    ("scheduler.py", "forward_stream.wait_stream(self.schedule_stream)", ("forward_entry",)),
    ("scheduler.py", "schedule_stream.wait_event(ev)", ("war_barrier.read_done_wait",)),
    ("scheduler.py", "schedule_stream.wait_stream(self.forward_stream)",
     ("war_barrier.fallback_wait",)),
    ("scheduler.py", "batch_record_buf[", ("batch_pin_ring",)),
    ("overlap_utils.py", "mix_running_indices.record_stream",
     ("mix_running_indices.record_stream",)),
    ("overlap_utils.py", "indices.record_stream", ("future_indices.record_stream",)),
    ("batch_result_processor.py", "copy_done.synchronize()", ("copy_done.host_sync",)),
    ("scheduler.py", "copy_stream.wait_stream(self.forward_stream)",
     ("copy_stream.forward_wait",)),
    ("common.py", "tensor.record_stream(", ("d2h_result.record_stream",)),
    # the same D2H keep-alive where older releases keep the helper (managers/utils.py, 0.5.20)
    ("utils.py", "_async_d2h", ".record_stream(", ("d2h_result.record_stream",)),
    # an event never recorded: its synchronize() returns at once, as with no host sync
    ("utils.py", "self.copy_done.record()", ("copy_done.host_sync",)),
    # the decode CUDA graph runner's read-done event: recorded inside the graph (its
    # external event), or fresh after the replay (decode_cuda_graph_runner.py 670 / 696)
    ("decode_cuda_graph_runner.py", "event.record()", ("read_done.record_in_graph",)),
    ("decode_cuda_graph_runner.py", "read_done.record()", ("read_done.record_post_replay",)),
    # the plan streams' joins (protocol.plan_stream_joins): the verify's plan stream waits on
    # F and F on it around verify's preparation; the draft worker's own plan stream the
    # same around the draft extend's
    ("eagle_worker_common.py", "run_eagle_verify", "plan_stream.wait_stream(fwd_stream)",
     ("plan.verify_forward_wait",)),
    ("eagle_worker_common.py", "run_eagle_verify", ".wait_stream(plan_stream)",
     ("plan.verify_join",)),
    ("eagle_worker_v2.py", "_draft_extend_for_decode", "self.plan_stream.wait_stream(",
     ("plan.extend_forward_wait",)),
    ("eagle_worker_v2.py", "_draft_extend_for_decode", ".wait_stream( self.plan_stream",
     ("plan.extend_join",)),
    # the verify's inputs marked used on F (protocol.verify_record_stream): before the
    # preparation (record_stream_for_v2_verify), after it (eagle_worker_common.py 597), and
    # the helper's own call that both go through (spec_utils.py 366: removing it removes both)
    ("spec_utils.py", "record_stream_for_v2_verify", "record_stream_each(candidates",
     ("verify_pre_prepare.record_stream",)),
    ("spec_utils.py", "record_stream_each", "t.record_stream(stream)",
     ("verify_pre_prepare.record_stream", "verify_inputs.record_stream")),
    ("eagle_worker_common.py", "run_eagle_verify", "record_stream_each((batch.input_ids",
     ("verify_inputs.record_stream",)),
    # the confidence relay's ring copy waits on publish_ready on the D2H stream (DSpark)
    ("overlap_utils.py", "issue_ring_copy", "stream.wait_event(publish_ready)",
     ("confidence.d2h_wait",)),
    # an event never recorded: every wait on it returns at once
    ("overlap_utils.py", "self.publish_ready.record()",
     ("publish_ready.schedule_wait", "publish_ready.d2h_wait")),
)

#: why a site has no counterpart, or why the model's verdict differs (file name, code piece)
_GRAMMAR_TREE = ("not modelled: GrammarTree's host copy of the verify tree (its event and "
                 "the host wait in resolve) has no counterpart in the model, which has no "
                 "grammar")
EXPLANATIONS: tuple[tuple[str, str, str], ...] = (
    ("spec_utils.py", "done.record()", _GRAMMAR_TREE),
    ("spec_utils.py", "self._done.synchronize()", _GRAMMAR_TREE),
    ("overlap_utils.py", "self.copy_done[slot].record()",
     "not modelled: without the record the ring slot's event is never recorded and its "
     "query() answers done at once; the model's confidence.copy_done_query stands for the "
     "probe removed (never done), not for this"),
)


#: (variant, function, model label) -> why that variant's scenario cannot judge the removal
#: of the site in that function (its qualified name's last part): the real
#: loop's configuration orders it through a path the model does not have. Such a row is
#: ``not_modelled`` with this reason, never a verdict the model is not built to give.
VARIANT_GAPS: dict[tuple[str, str, str], str] = {
    ("grammar_eagle_topk1", "process_batch_result_prefill", "copy_done.host_sync"): (
        "not modelled: the grammar barrier's own host wait on the same copy_done "
        "(advance_grammar_fsm, batch_result_processor.py:903) makes the result processor's "
        "wait redundant in the real loop; the model has no grammar barrier"),
    ("grammar_eagle_topk1", "_draft_extend_for_decode", "plan.extend_forward_wait"): (
        "not modelled: the grammar path's host waits inside the verify (the previous "
        "result's copy_done, GrammarTree.resolve) order the draft extend's plan in the real "
        "loop; the model has no grammar path"),
    ("embedding", "_apply_war_barrier", "war_barrier.fallback_wait"): (
        "not modelled: the model has no embedding mode (one-token generation requests stand "
        "in) and does not reproduce the real race (the next schedule's merge reading a "
        "prefill input the forward stream made, schedule_batch.py merge_batch)"),
    ("eagle_mixed_hip", "_apply_war_barrier", "war_barrier.fallback_wait"): (
        "not modelled: the model's HIP spec-v2 run does not reproduce the real race (the "
        "mixed tails' seq_lens gathered on the forward stream, read by the next schedule's "
        "merge_batch); the CUDA twin eagle_mixed agrees"),
    ("eagle_d2h_stream_hip", "process_batch_result_prefill", "copy_done.host_sync"): (
        "not modelled: on HIP the host lengths are copied with a blocking .cpu() on the "
        "schedule stream after the host waits on publish_ready (no private D2H stream), "
        "which makes the prefill result wait redundant in the real loop; the model's "
        "schedule-stream D2H does not order it"),
}


#: variant -> why none of its rows is judged by the model: the variant races as released
#: (a finding of docs/findings.md), so a removal's real verdict is "new races beside the
#: released ones", while the model column is a run's own verdict, which a racing base makes
#: "race" whatever is removed. Its rows are ``not_modelled`` with this reason.
VARIANTS_NOT_MODELLED: dict[str, str] = {
    "multi_layer_eagle": (
        "not modelled: the multi-layer EAGLE worker races as released (its draft extend's "
        "preparation on the plan stream waits for nothing: docs/findings.md), and the model "
        "column judges a run, not the races a removal adds to a racing base"),
    "multi_layer_eagle_graph": (
        "not modelled: the multi-layer EAGLE worker under its one-graph draft-extend runner "
        "races as released (the same plan-stream block as eager: docs/findings.md), and the "
        "model column judges a run, not the races a removal adds to a racing base"),
    "multi_layer_eagle_step_graphs": (
        "not modelled: the multi-layer EAGLE worker under its per-step draft-extend graphs "
        "races as released (the same plan-stream block as eager: docs/findings.md), and the "
        "model column judges a run, not the races a removal adds to a racing base"),
    "dspark_no_host_lengths": (
        "not modelled: DSpark's relay without host lengths races as released (the ring copy "
        "against the next scatter: docs/findings.md), and the model column judges a run, not "
        "the races a removal adds to a racing base"),
}


def _function_matches(wanted: str, function: str | None) -> bool:
    """Whether a site in ``function`` (a qualified name; None: not known) is in the function
    an entry names: the whole qualified name or its last part."""
    return function is not None and (function == wanted or function.endswith(f".{wanted}"))


def labels_for(file_name: str, code: str, function: str | None = None) -> tuple[str, ...]:
    """The model's labels removed for the SGLang site in ``function`` (empty: no
    counterpart); an entry naming a function matches only a site known to be in it."""
    for entry in SITE_LABELS:
        if len(entry) == 4:
            name, wanted, piece, labels = entry
            if not _function_matches(wanted, function):
                continue
        else:
            name, piece, labels = entry
        if name == file_name and piece in code:
            return labels
    return ()


def explanation_for(file_name: str, code: str) -> str | None:
    """The committed reason for a site's disagreement or missing counterpart, if any."""
    return next((text for name, piece, text in EXPLANATIONS
                 if name == file_name and piece in code), None)


#: protocol keys changed for a release, as hashable pairs (``model_protocol.release_protocol``)
Protocol = tuple[tuple[str, Any], ...]


@cache
def model_verdict(variant: str, labels: tuple[str, ...], protocol: Protocol = ()) -> str:
    """The model's verdict for the variant's scenario with ``labels`` removed, its protocol
    keys changed by ``protocol`` (the release's differences from the scenarios' keys);
    ``not_modelled`` when there are none or the run reaches none of them."""
    path = MODEL_SCENARIOS / f"sglang_loop_{variant}.toml"
    if not labels or not path.exists():
        return "not_modelled"
    base = next(run for run in expand(load_scenario(path)) if not run.mutation_name)
    if protocol:
        base = dataclasses.replace(base, protocol=dataclasses.replace(base.protocol,
                                                                      **dict(protocol)))
    removed = frozenset(labels)
    result = run_spec(dataclasses.replace(base, removed=removed, mutation_name="loop_site",
                                          allow_unused=True), oracle=False)  # verdict only
    if not removed & set(result.labels_used):
        return "not_modelled"
    return result.verdict


def _explain(file_name: str, code: str, real: str, model: str, variant: str,
             labels: Sequence[str]) -> str:
    if real == "not_reached":
        return f"the variant never runs this line (coverage gap for {variant})"
    if real == model:
        return (f"agrees: the model's sglang_loop_{variant} without "
                f"{', '.join(labels)} is {model} too")
    known = explanation_for(file_name, code)
    if known:
        return known
    if model == "not_modelled":
        return (f"not modelled: no sync label of the model stands for this site, or "
                f"sglang_loop_{variant} never reaches it")
    return (f"real loop {real}, model {model}: the model does not follow SGLang here "
            "(model out of date); see the races' SGLang file:line")


def build_rows(necessity: Iterable[dict[str, Any]], protocol: Protocol = ()
               ) -> list[dict[str, Any]]:
    """The report's rows from the necessity table's JSON rows (``overlap-harness sglang
    --necessity --json``): site as ``file:line`` inside the sglang package; the model's
    scenarios run with the release's ``protocol`` differences."""
    rows = []
    for entry in necessity:
        site = short_site(entry["site"])
        file_name = Path(site.rsplit(":", 1)[0]).name
        real = entry["real"] if entry["verdict"] != "error" else "error"
        labels = labels_for(file_name, entry["code"], entry.get("function"))
        # a site the real loop never runs is not compared: the same code can stand in
        # another function for another mechanism (the spec-v2 twins of publish_ready's waits)
        function = (entry.get("function") or "").rsplit(".", 1)[-1]
        gap = VARIANTS_NOT_MODELLED.get(entry["variant"]) or next(
            (VARIANT_GAPS[key] for label in labels
             if (key := (entry["variant"], function, label)) in VARIANT_GAPS), None)
        model = (model_verdict(entry["variant"], labels, protocol)
                 if real in ("race", "race_free") and gap is None else "not_modelled")
        rows.append({"variant": entry["variant"], "site": site,
                     "function": entry.get("function"), "code": entry["code"],
                     "real": real, "races": len(entry["races"]),
                     "race_examples": [_race_text(r) for r in entry["races"][:2]],
                     "model_labels": list(labels), "model": model,
                     "agrees": real == model,
                     "explanation": gap or _explain(file_name, entry["code"], real, model,
                                                    entry["variant"], labels)})
    return rows


def released_races(races: Iterable[dict[str, Any]], per_variant: int = 8
                   ) -> dict[str, list[str]]:
    """Each variant whose unmodified loop races (the tree as released): its distinct race
    texts, as a row's ``race_examples`` (up to ``per_variant``): the GPU table forces them
    on the unmodified loop as it forces a removed site's."""
    out: dict[str, list[str]] = {}
    for race in races:
        examples = out.setdefault(race["variant"], [])
        text = _race_text(race)
        if text not in examples and len(examples) < per_variant:
            examples.append(text)
    return out


def short_site(site: str) -> str:
    """``sglang/srt/managers/scheduler.py:4672`` for a site anywhere inside a sglang tree, and
    ``sglang/kernels/ops/kvcache/copy_pages.py:61`` for one of the package outside ``srt``
    (the path from the package folder on, so that a GPU run's probe, whose tree is elsewhere,
    matches it: the last ``/sglang/`` of a cache path such as ``.../sglang/0.5.23/sglang/``);
    a site in the harness's own files from ``overlap_harness/`` on (a stand-in's race side,
    the same whichever checkout ran). A site already named so (relative,
    :func:`~overlap_harness.engines.core.results.shown_file`) stays as it is."""
    rooted = site if site.startswith("/") else "/" + site
    harness = "/overlap_harness/"
    if harness in rooted:
        return "overlap_harness/" + rooted.split(harness, 1)[1]
    marker = "/sglang/srt/"
    if marker in rooted:
        return "sglang/srt/" + rooted.split(marker, 1)[1]
    if "/sglang/" in rooted:
        return "sglang/" + rooted.rsplit("/sglang/", 1)[1]
    return site


def _race_text(race: dict[str, Any]) -> str:
    first, second = race["first"], race["second"]
    return (f"{race['kind']} {race['tensor']}: {first['op']} on {first['stream']} at "
            f"{short_site(first['file'])}:{first['line']} / {second['op']} on "
            f"{second['stream']} at {short_site(second['file'])}:{second['line']}")


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts: rows, reached rows, disagreements (reached rows whose model verdict is
    ``race``/``race_free`` and differs from the real one), not_modelled reached rows."""
    reached = [r for r in rows if r["real"] in ("race", "race_free")]
    modelled = [r for r in reached if r["model"] != "not_modelled"]
    not_modelled = len(reached) - len(modelled)
    return {"rows": len(rows), "reached": len(reached),
            "race": sum(r["real"] == "race" for r in reached),
            "race_free": sum(r["real"] == "race_free" for r in reached),
            "not_reached": sum(r["real"] == "not_reached" for r in rows),
            "error": sum(r["real"] == "error" for r in rows),
            "modelled": len(modelled),
            "disagreements": sum(r["model"] != r["real"] for r in modelled),
            "not_modelled": not_modelled,
            "not_modelled_fraction": round(not_modelled / len(reached), 4) if reached else 0.0}


def write(document: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """``sglang-<version>-loop.json`` and ``.md`` in ``out_dir`` from the necessity document
    (``overlap-harness sglang --necessity``'s JSON); returns both paths."""
    from overlap_harness.engines.sglang.report.model_protocol import release_protocol

    protocol = release_protocol()
    rows = build_rows(document["necessity"], tuple(sorted(protocol.items())))
    version = document["sglang_version"]
    sites = site_configs.per_site(rows)
    report = {"sglang_version": version, "variants": document["variants"],
              "configurations": document.get("configurations", {}),
              **({"model_protocol": protocol} if protocol else {}),
              "summary": summarize(rows), "sites": sites,
              "unreached_sites": site_configs.unreached_sites(sites,
                                                              Path(document["source"])),
              "released_races": released_races(document.get("races", [])),
              "rows": rows}
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"sglang-{version}-loop.json"
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    md_path = out_dir / f"sglang-{version}-loop.md"
    md_path.write_text(markdown(report))
    return json_path, md_path


def markdown(report: dict[str, Any]) -> str:
    """The report as a page: the summary, the reached rows, the sites no variant reaches."""
    counts = report["summary"]
    lines = [f"# SGLang {report['sglang_version']}'s own overlap loop beside the model", "",
             "Written by `overlap-harness sglang --necessity --loop-report DIR` "
             "(overlap_harness/engines/sglang/report/loop_report.py). Per variant and sync "
             "site: the real loop with that statement removed (`real`) and the model's "
             "scenario of the variant with its counterpart removed (`model`).", "",
             f"Rows {counts['rows']}: reached {counts['reached']} (race {counts['race']}, "
             f"race_free {counts['race_free']}), not reached {counts['not_reached']}, "
             f"error {counts['error']}. Modelled {counts['modelled']}, disagreements "
             f"{counts['disagreements']}, not_modelled {counts['not_modelled']} "
             f"({counts['not_modelled_fraction']:.0%} of reached rows).", "",
             *_protocol_lines(report.get("model_protocol", {})),
             "| variant | site | code | real | races | model | explanation |",
             "|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        if row["real"] == "not_reached":
            continue
        code = row["code"].replace("|", "\\|")[:70]
        lines.append(f"| {row['variant']} | {row['site']} | `{code}` | {row['real']} | "
                     f"{row['races']} | {row['model']} | {row['explanation']} |")
    lines += ["", *site_configs.markdown(report["sites"], report["unreached_sites"]),
              *_configuration_lines(report.get("configurations", {}))]
    return "\n".join(lines)


def _configuration_lines(configurations: dict[str, dict[str, str]]) -> list[str]:
    """Each variant's SGLang configuration (configurations.py): what its verdicts hold under."""
    if not configurations:
        return []
    lines = ["", "## The variants' configurations", "",
             "Each verdict above holds under its variant's configuration (`--config KEY=VALUE` "
             "runs the variants of one).", "", "| variant | configuration |", "|---|---|"]
    for name, config in configurations.items():
        lines.append(f"| {name} | {' '.join(f'{k}={v}' for k, v in config.items())} |")
    return lines


def _protocol_lines(protocol: dict[str, Any]) -> list[str]:
    """Where the model scenarios' keys were changed for this release, and why."""
    if not protocol:
        return []
    from overlap_harness.engines.sglang.report.model_protocol import described

    return ["The model follows this release: its scenarios run with",
            *[f"- {line}" for line in described(protocol)], ""]
