"""The model column of TokenSpeed's necessity table: each sync site removed from the real loop,
beside the protocol model's removal of its counterpart.

The model (``model/protocol/one_forward_thread.py``) runs each variant's scenario
(``conformance/model_scenarios/tokenspeed_loop_<variant>.toml``: the variant's rounds, TokenSpeed
0.1.1's design) with the sync label that stands for the site removed. A site is matched on its
file and code, not its line, so a moved line keeps its counterpart. A reached row gets the
model's verdict where the site has a counterpart and the variant's scenario can judge it;
otherwise ``not_modelled`` with the reason (:data:`VARIANT_GAPS`, or no counterpart). Computing
the column needs no TokenSpeed: a test recomputes it from the committed report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from overlap_harness.runner import run_spec
from overlap_harness.scenarios.expand import expand
from overlap_harness.scenarios.loader import load_scenario

MODEL_SCENARIOS = Path(__file__).resolve().parents[2] / "conformance" / "model_scenarios"

#: (file name, a piece of the statement's code, the model's sync label removed for it)
SITE_LABELS: tuple[tuple[str, str, str], ...] = (
    ("model_executor.py", "execution_stream.wait_stream(self.default_stream)",
     "exec.forward_wait"),
    ("types.py", "copy_event.synchronize()", "copy_event.host_wait"),
    ("model_executor.py", "copy_event.record()", "copy_event.record"),
)
#: the same code in another function stands for another wait: (function's last part, label)
FUNCTION_LABELS: dict[tuple[str, str], str] = {
    ("_write_valid_cache_lengths", "execution_stream.wait_stream(self.default_stream)"):
        "exec.cache_lengths_wait",
}

#: (variant, model label) -> why that variant's scenario cannot judge the removal (a row
#: ``not_modelled`` with this reason, never a verdict the model is not built to give); none
#: for TokenSpeed 0.1.1
VARIANT_GAPS: dict[tuple[str, str], str] = {}


def label_for(file_name: str, code: str, function: str | None) -> str | None:
    """The model's label for the site, or None when it has no counterpart."""
    last = (function or "").rsplit(".", 1)[-1]
    for (wanted, piece), label in FUNCTION_LABELS.items():
        if last == wanted and piece in code:
            return label
    return next((label for name, piece, label in SITE_LABELS
                 if name == file_name and piece in code), None)


@cache
def model_verdict(variant: str, label: str) -> str:
    """The model's verdict for the variant's scenario with ``label`` removed;
    ``not_modelled`` where the variant has no scenario or the run never reaches the label."""
    path = MODEL_SCENARIOS / f"tokenspeed_loop_{variant}.toml"
    if not path.exists():
        return "not_modelled"
    base = next(run for run in expand(load_scenario(path)) if not run.mutation_name)
    result = run_spec(dataclasses.replace(base, removed=frozenset({label}),
                                          mutation_name="loop_site", allow_unused=True))
    return result.verdict if label in result.labels_used else "not_modelled"


def model_row(row: dict[str, Any]) -> dict[str, Any]:
    """The model's columns for one necessity row (``real``, ``variant``, ``site``, ``code``,
    ``function``): ``model_label``, ``model`` and ``explanation``."""
    file_name = Path(row["site"].rsplit(":", 1)[0]).name
    label = label_for(file_name, row["code"], row.get("function"))
    real = row["real"]
    if real not in ("race", "race_free"):
        return {"model_label": label, "model": "not_modelled",
                "explanation": f"the variant never runs this line ({real})"}
    if label is None:
        return {"model_label": None, "model": "not_modelled",
                "explanation": "not modelled: no sync label of the model stands for this site"}
    gap = VARIANT_GAPS.get((row["variant"], label))
    if gap is not None:
        return {"model_label": label, "model": "not_modelled", "explanation": gap}
    model = model_verdict(row["variant"], label)
    if model == real:
        text = (f"agrees: the model's tokenspeed_loop_{row['variant']} without {label} is "
                f"{model} too")
    elif model == "not_modelled":
        text = f"not modelled: tokenspeed_loop_{row['variant']} never reaches {label}"
    else:
        text = f"real loop {real}, model {model}: the model does not follow TokenSpeed here"
    return {"model_label": label, "model": model, "explanation": text}


def summary(rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Reached rows, those the model judges, its disagreements, the rows not modelled."""
    reached = [r for r in rows if r["real"] in ("race", "race_free")]
    judged = [r for r in reached if r["model"] != "not_modelled"]
    return {"reached": len(reached), "modelled": len(judged),
            "disagreements": sum(r["model"] != r["real"] for r in judged),
            "not_modelled": len(reached) - len(judged)}
