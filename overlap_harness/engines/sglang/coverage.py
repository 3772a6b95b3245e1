"""docs/sglang-configurations.md: which SGLang configurations the variants drive, generated
from their features.

For each configuration key (:data:`.configurations.SWITCHES`: an SGLang server option or
environment switch that changes the overlap path) the variants that run each of its values;
for each feature (:data:`.variants.FEATURE_ORDER`) the SGLang options it drives and the
variants composed with it; and the options known to change the path that no feature drives,
each with the reason (:data:`NOT_DRIVEN`). ``python tools/sglang_configurations_page.py``
writes the page; a test checks that the committed page is this module's output.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from overlap_harness.engines.sglang.configurations import SWITCHES, configuration
from overlap_harness.engines.sglang.variants import FEATURE_ORDER, VARIANTS, Variant

PAGE = "docs/sglang-configurations.md"


@dataclass(frozen=True, slots=True)
class NotDriven:
    """An SGLang option that changes the overlap path and that no feature drives: what it
    selects in SGLang (read from its source, the function named) and why it is not driven."""

    option: str
    selects: str
    why: str


#: read from SGLang 0.5.23's ``scheduler.py`` (``_dispatch_event_loop_once``) and
#: ``speculative/spec_info.py`` (``SpeculativeAlgorithm.create_worker``)
NOT_DRIVEN: tuple[NotDriven, ...] = (
    NotDriven("`--disable-overlap-schedule`", "`event_loop_normal` (scheduler.py, "
              "`_dispatch_event_loop_once`)",
              "no overlap: the forward and the next schedule do not run concurrently, the "
              "path this check is about"),
    NotDriven("`--pp-size` > 1", "`event_loop_pp` (scheduler_pp_mixin.py)",
              "another event loop than `event_loop_overlap`; no feature builds pipeline "
              "stages"),
    NotDriven("`--disaggregation-mode prefill` / `decode`",
              "`event_loop_overlap_disagg_prefill` / `_decode` (disaggregation/prefill.py, "
              "decode.py)", "other event loops, with KV transfer queues; no feature drives "
              "them"),
    NotDriven("`--enable-pdmux`", "`event_loop_pdmux` (multiplex/multiplexing_mixin.py)",
              "another event loop; no feature drives it"),
    NotDriven("MLX (`use_mlx()`)", "`event_loop_overlap_mlx` "
              "(hardware_backend/mlx/scheduler_mixin.py)", "another platform's event loop"),
    NotDriven("a hybrid (mamba / linear-attention) model's request pool in the scheduler",
              "`HybridReqToTokenPool` and its `MambaPool` (mem_cache/memory_pool.py): the "
              "scheduler allocates, frees and copies a mamba slot per request "
              "(`mamba_allocator` in scheduler.py, the mamba-aware cache)",
              "no feature builds a hybrid model's pools or state. The multi-layer worker's "
              "boundary-KV window, which SGLang turns on only for such a pool, is driven "
              "(`BoundaryKvWindow`, features/boundary_kv.py) with a stand-in: the scheduler's "
              "plain pool shown to the worker as a `HybridReqToTokenPool` with a conv state's "
              "shape (stand_ins/hybrid_pool.py); the scheduler's own mamba paths and the "
              "target verify's mamba-state commit stay undriven"),
    NotDriven("multi-layer EAGLE draft-extend metadata staged before the verify",
              "`MultiLayerEagleDraftWorker._draft_extend_plan_for_decode` -> the runner's "
              "`stage_shared_reads` (speculative/multi_layer_eagle_worker_v2.py)",
              "SGLang stages only when every step's backend supports staging without "
              "capturing its draft-extend metadata in the graph; in 0.5.23 only Inkling's "
              "short-conv hybrid backend (`inkling_sconv_backend.py`) answers so (FA3 "
              "captures it in the graph: the path the graph variants drive), and it needs "
              "Inkling's backend and a hybrid model's state, which no feature builds; with "
              "the boundary-KV window on, a staged draft extend takes the window's slots "
              "and positions from the runner's static buffers "
              "(`_draft_extend_for_decode`), not driven either (the window under the "
              "graphs is driven unstaged: `multi_layer_eagle_boundary_kv_graph`, "
              "`_step_graphs`)"),
    NotDriven("`enable_multi_layer_eagle` with topk > 1, rejection sampling or a "
              "chain-hidden-state MTP model",
              "`MultiLayerEagleDraftWorker` (speculative/multi_layer_eagle_worker_v2.py)",
              "the MultiLayerEagle feature drives topk 1 with greedy target-only sampling "
              "and a non-chain draft (`chain_mtp_hidden_states` False); eager and under its "
              "draft-extend graphs (one graph and per step)"),
    NotDriven("`--speculative-algorithm STANDALONE`", "`StandaloneWorkerV2` "
              "(speculative/standalone_worker_v2.py)", "no feature builds this worker"),
    NotDriven("`--speculative-algorithm NGRAM`", "`NGRAMWorker` (speculative/ngram_worker.py)",
              "no feature builds this worker"),
    NotDriven("`--speculative-algorithm DFLASH`", "`DFlashWorkerV2` "
              "(speculative/dflash_worker_v2.py)", "no feature builds this worker (DSpark "
              "shares its draft input, `DFlashDraftInputV2`)"),
    NotDriven("`--speculative-algorithm UNO`", "`UnoWorkerV2` (speculative/uno_worker_v2.py)",
              "no feature builds this worker"),
    NotDriven("`--speculative-algorithm FROZEN_KV_MTP`", "`FrozenKVMTPWorkerV2` "
              "(speculative/frozen_kv_mtp_worker_v2.py)", "no feature builds this worker"),
)


def _file(cls: type) -> str:
    """A feature class's module as a path from the package folder on."""
    return cls.__module__.removeprefix("overlap_harness.engines.sglang.").replace(".", "/") \
        + ".py"


def _first_sentence(cls: type) -> str:
    """The first sentence of a class's docstring, on one line."""
    text = " ".join((inspect.getdoc(cls) or "").split())
    end = text.find(". ")
    return text if end < 0 else text[:end + 1]


def _names(variants: list[Variant]) -> str:
    return ", ".join(f"`{v.name}`" for v in variants) if variants else "none"


def markdown(variants: dict[str, Variant] | None = None) -> str:
    """The page, from the variants' features (``variants``: :data:`.variants.VARIANTS`)."""
    variants = VARIANTS if variants is None else variants
    configs = {name: configuration(v) for name, v in variants.items()}
    lines = ["# SGLang configurations the loop drives", "",
             "Generated from the variants' features by `python tools/sglang_configurations_page"
             ".py` (`overlap_harness/engines/sglang/coverage.py`; a test checks that this page "
             "is its output). A variant is its arrivals and a tuple of features, each one "
             "SGLang switch or component (`overlap_harness/engines/sglang/features/`, the hooks: "
             "docs/sglang-loop.md, Features). `--config KEY=VALUE` selects the variants by "
             "these keys.", "",
             "## Configuration keys", "",
             "| key | SGLang | value | variants | set by |", "|---|---|---|---|---|"]
    for switch in SWITCHES:
        setters = ", ".join(cls.__name__ for cls in FEATURE_ORDER if switch.key in cls.keys)
        for value in switch.values:
            running = [variants[n] for n, c in configs.items() if c.get(switch.key) == value]
            default = " (default)" if value == switch.default else ""
            lines.append(f"| `{switch.key}` | {switch.what} | `{value}`{default} | "
                         f"{_names(running)} | {setters or '-'} |")
    lines += ["", "A key absent from a variant's configuration does not apply to it (the plan "
              "stream without speculation); `--config` keeps such a variant.", "",
              "## Features", "",
              "| feature | file | SGLang options | keys | variants |", "|---|---|---|---|---|"]
    for cls in FEATURE_ORDER:
        using = [v for v in variants.values() if v.has(cls)]
        lines.append(f"| `{cls.__name__}`: {_first_sentence(cls)} | `{_file(cls)}` | "
                     f"{', '.join(f'`{o}`' for o in cls.options) or '-'} | "
                     f"{', '.join(f'`{k}`' for k in cls.keys) or '-'} | {_names(using)} |")
    lines += ["", "## Known and not driven", "",
              "SGLang options that change the overlap path and that no feature drives (read "
              "from SGLang 0.5.23's `scheduler.py`, `_dispatch_event_loop_once`, and "
              "`speculative/spec_info.py`, `SpeculativeAlgorithm.create_worker`):", "",
              "| option | selects | why not driven |", "|---|---|---|"]
    lines += [f"| {n.option} | {n.selects} | {n.why} |" for n in NOT_DRIVEN]
    return "\n".join(lines) + "\n"
