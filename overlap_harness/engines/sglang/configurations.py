"""The SGLang configuration each variant runs under, and ``--config``: the variants of one.

A verdict holds under a configuration: 0.5.19's EAGLE path races with the plan stream on
(``SGLANG_ENABLE_OVERLAP_PLAN_STREAM``, off by default) and is race-free with it off. A team
that runs a pinned release with its own options wants the verdict of those options alone, so
every variant states its configuration as SGLang's switches (key = value, below), computed
from the variant's fields (a new variant is described without being listed here), and
``--config KEY=VALUE`` (repeatable) keeps the variants whose configuration agrees. A variant
agrees with ``KEY=VALUE`` when it has that value, or when KEY does not apply to it (the plan
stream is a switch of speculative decoding only: a variant without speculation runs under
either value). The variants left out are listed with the key that left them out; a
selection no variant agrees with is bad input.
"""

from __future__ import annotations

from dataclasses import dataclass

from overlap_harness.engines.sglang.variants import Variant


@dataclass(frozen=True, slots=True)
class Switch:
    """One configuration key: what it is in SGLang's terms and the values it takes."""

    key: str
    what: str
    values: tuple[str, ...]


ON_OFF = ("on", "off")

#: every key, in the order configurations are printed
SWITCHES: tuple[Switch, ...] = (
    Switch("platform", "the device the loop's branches are written for (SGLang's _is_hip)",
           ("cuda", "hip")),
    Switch("model", "the model kind (is_generation)", ("generation", "embedding")),
    Switch("speculative", "speculative decoding (--speculative-algorithm)",
           ("none", "eagle", "dspark")),
    Switch("multi_layer_eagle", "EAGLE's multi-layer worker of MTP models, one draft runner "
           "per step (--enable-multi-layer-eagle)", ON_OFF),
    Switch("eagle_topk", "EAGLE's draft candidates per step (--speculative-eagle-topk)",
           ("1", "4")),
    Switch("plan_stream", "the spec-v2 plan stream (SGLANG_ENABLE_OVERLAP_PLAN_STREAM, off by "
           "default)", ON_OFF),
    Switch("cuda_graph", "the forwards CUDA graphs replay (--disable-cuda-graph: off)",
           ("off", "decode", "verify_and_draft_extend")),
    Switch("attention_reads_end", "where the attention backend's shared req_to_token reads "
           "end (SharedReadEnds: inside the graph replay, after it, before it)",
           ("in_replay", "post_replay", "pre_replay")),
    Switch("ragged_verify", "DSpark's ragged verify mode (SGLANG_RAGGED_VERIFY_MODE; all but "
           "static relay the draft confidence)", ("static", "cap-accept", "compact")),
    Switch("cpu_seq_lens", "attention backends that need host sequence lengths", ON_OFF),
    Switch("chunked_prefill", "chunked prefill (--chunked-prefill-size)", ON_OFF),
    Switch("mixed_chunk", "prefill chunks mixed into decode batches (--enable-mixed-chunk)",
           ON_OFF),
    Switch("radix_cache", "the radix prefix cache (--disable-radix-cache: off)", ON_OFF),
    Switch("grammar", "grammar-constrained requests", ON_OFF),
    Switch("delay_sample", "delayed sampling (SGLANG_ENABLE_DELAY_SAMPLE)", ON_OFF),
    Switch("dp_attention", "attention data parallelism (--enable-dp-attention)", ON_OFF),
    Switch("unified_memory", "a hybrid-SWA model's KV in one lazily compacted pool "
           "(--enable-unified-memory)", ON_OFF),
)
_BY_KEY = {switch.key: switch for switch in SWITCHES}


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def configuration(variant: Variant) -> dict[str, str]:
    """``variant``'s SGLang configuration, key -> value (keys that do not apply are absent)."""
    config = {"platform": "hip" if variant.hip else "cuda",
              "model": "embedding" if variant.embedding else "generation",
              "speculative": ("eagle" if variant.eagle is not None
                              else "dspark" if variant.dspark is not None else "none")}
    graphs = "off"
    if variant.decode_graph_sizes:
        graphs = "decode"
    if variant.eagle is not None:
        config["multi_layer_eagle"] = _on(variant.eagle.multi_layer)
        config["eagle_topk"] = str(variant.eagle.topk)
        config["plan_stream"] = _on(variant.eagle.plan_stream)
        config["cpu_seq_lens"] = _on(variant.eagle.needs_cpu_seq_lens)
        if variant.eagle.verify_graph_sizes or variant.eagle.draft_extend_graph:
            graphs = "verify_and_draft_extend"
    if variant.dspark is not None:
        config["plan_stream"] = "off"  # DFlashDraftInputV2 reads the same switch, unset
        config["ragged_verify"] = variant.dspark.ragged_verify_mode.value
        config["cpu_seq_lens"] = _on(variant.dspark.needs_cpu_seq_lens)
    config["cuda_graph"] = graphs
    if variant.decode_graph_sizes:
        config["attention_reads_end"] = ("post_replay" if variant.graph_reads_end_post_replay
                                         else "pre_replay" if variant.graph_reads_end_pre_replay
                                         else "in_replay")
    elif variant.eager_prefill_pre_replay or (
            variant.unified_memory is not None
            and variant.unified_memory.prefill_reads_end_pre_replay):
        config["attention_reads_end"] = "pre_replay"
    config["chunked_prefill"] = _on(variant.chunked_prefill_size is not None)
    config["mixed_chunk"] = _on(variant.mixed_chunk)
    config["radix_cache"] = _on(variant.radix_cache)
    config["grammar"] = _on(variant.grammar)
    config["delay_sample"] = _on(variant.delay_sample)
    config["dp_attention"] = _on(variant.dp_peer is not None)
    config["unified_memory"] = _on(variant.unified_memory is not None)
    unknown = set(config) - set(_BY_KEY)
    assert not unknown, f"configuration keys without a Switch: {sorted(unknown)}"
    return {switch.key: config[switch.key] for switch in SWITCHES if switch.key in config}


class ConfigError(ValueError):
    """A ``--config`` that names no key, or a value the key does not take: ``problems`` holds
    every one (one line each, saying what is accepted)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def parse(items: list[str]) -> dict[str, str]:
    """``["plan_stream=off", ...]`` -> ``{"plan_stream": "off"}``; every problem at once
    (:class:`ConfigError`)."""
    wanted: dict[str, str] = {}
    problems = []
    for item in items:
        key, equals, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not equals or not key or not value:
            problems.append(f"--config {item!r}: expected KEY=VALUE, e.g. plan_stream=off")
        elif key not in _BY_KEY:
            problems.append(f"--config {item!r}: no key {key!r} (keys: "
                            f"{', '.join(_BY_KEY)})")
        elif value not in _BY_KEY[key].values:
            problems.append(f"--config {item!r}: {key} takes "
                            f"{'|'.join(_BY_KEY[key].values)}, got {value!r}")
        elif wanted.get(key, value) != value:
            problems.append(f"--config {item!r}: {key} already asked as {wanted[key]!r}")
        else:
            wanted[key] = value
    if problems:
        raise ConfigError(problems)
    return wanted


def disagreement(variant: Variant, wanted: dict[str, str]) -> str | None:
    """Why ``variant`` is not of the configuration ``wanted`` (None: it is)."""
    config = configuration(variant)
    keys = [key for key, value in wanted.items() if key in config and config[key] != value]
    if not keys:
        return None
    runs = ", ".join(f"{key}={config[key]}" for key in keys)
    asked = ", ".join(f"{key}={wanted[key]}" for key in keys)
    return f"runs with {runs}; --config asks {asked}"


def select(variants: dict[str, Variant], names: list[str],
           wanted: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The ``names`` of the configuration ``wanted`` and, for the others, why not. Raises
    :class:`ConfigError` when none is left (a selection that runs nothing passes nothing)."""
    chosen, left_out = [], {}
    for name in names:
        if (reason := disagreement(variants[name], wanted)) is None:
            chosen.append(name)
        else:
            left_out[name] = reason
    if not chosen:
        asked = " ".join(f"--config {key}={value}" for key, value in wanted.items())
        raise ConfigError([f"no variant runs under {asked} (of {', '.join(names)})"])
    return chosen, left_out


def describe(config: dict[str, str]) -> str:
    """``platform=cuda speculative=eagle ...``: a configuration on one line."""
    return " ".join(f"{key}={value}" for key, value in config.items())
