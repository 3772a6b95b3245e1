"""The SGLang configuration each variant runs under, and ``--config``: the variants of one.

A verdict holds under a configuration: 0.5.19's EAGLE path races with the plan stream on
(``SGLANG_ENABLE_OVERLAP_PLAN_STREAM``, off by default) and is race-free with it off. A team
that runs a pinned release with its own options wants the verdict of those options alone, so
every variant states its configuration as SGLang's switches (key = value, below), computed
from its features (each sets its own keys: :mod:`.features.api`; a new variant is described
without being listed here), and
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
    """One configuration key: what it is in SGLang's terms, the values it takes, and its
    value in a variant whose features do not set it (None: the key does not apply then)."""

    key: str
    what: str
    values: tuple[str, ...]
    default: str | None = None


ON_OFF = ("on", "off")

#: every key, in the order configurations are printed
SWITCHES: tuple[Switch, ...] = (
    Switch("platform", "the device the loop's branches are written for (SGLang's _is_hip)",
           ("cuda", "hip"), "cuda"),
    Switch("model", "the model kind (is_generation)", ("generation", "embedding"),
           "generation"),
    Switch("speculative", "speculative decoding (--speculative-algorithm)",
           ("none", "eagle", "dspark"), "none"),
    Switch("multi_layer_eagle", "EAGLE's multi-layer worker of MTP models, one draft runner "
           "per step (--enable-multi-layer-eagle; set by multi-layer variants only)", ON_OFF),
    Switch("boundary_kv", "the multi-layer EAGLE worker's boundary-KV window "
           "(SGLANG_ENABLE_MTP_BOUNDARY_KV_FIX, on by default, with a hybrid model's pool; "
           "set by multi-layer variants only)", ON_OFF),
    Switch("eagle_topk", "EAGLE's draft candidates per step (--speculative-eagle-topk)",
           ("1", "4")),
    Switch("plan_stream", "the spec-v2 plan stream (SGLANG_ENABLE_OVERLAP_PLAN_STREAM, off by "
           "default)", ON_OFF),
    Switch("cuda_graph", "the forwards CUDA graphs replay (--disable-cuda-graph: off)",
           ("off", "decode", "verify_and_draft_extend"), "off"),
    Switch("single_cg_draft", "the multi-layer EAGLE draft extend's steps in one CUDA graph "
           "(SGLANG_ENABLE_SINGLE_CG_DRAFT, on by default) or one graph per step",
           ON_OFF),
    Switch("attention_reads_end", "where the attention backend's shared req_to_token reads "
           "end (SharedReadEnds: inside the graph replay, after it, before it)",
           ("in_replay", "post_replay", "pre_replay")),
    Switch("ragged_verify", "DSpark's ragged verify mode (SGLANG_RAGGED_VERIFY_MODE; all but "
           "static relay the draft confidence)", ("static", "cap-accept", "compact")),
    Switch("cpu_seq_lens", "attention backends that need host sequence lengths", ON_OFF),
    Switch("chunked_prefill", "chunked prefill (--chunked-prefill-size)", ON_OFF, "off"),
    Switch("mixed_chunk", "prefill chunks mixed into decode batches (--enable-mixed-chunk)",
           ON_OFF, "off"),
    Switch("radix_cache", "the radix prefix cache (--disable-radix-cache: off)", ON_OFF, "off"),
    Switch("grammar", "grammar-constrained requests", ON_OFF, "off"),
    Switch("delay_sample", "delayed sampling (SGLANG_ENABLE_DELAY_SAMPLE)", ON_OFF, "off"),
    Switch("dp_attention", "attention data parallelism (--enable-dp-attention)", ON_OFF, "off"),
    Switch("unified_memory", "a hybrid-SWA model's KV in one lazily compacted pool "
           "(--enable-unified-memory)", ON_OFF, "off"),
)
_BY_KEY = {switch.key: switch for switch in SWITCHES}


def configuration(variant: Variant) -> dict[str, str]:
    """``variant``'s SGLang configuration, key -> value (keys that do not apply are absent):
    each switch's default, then what each feature sets. A key two features set to different
    values, or one a feature does not declare, is an error of the features."""
    config = {switch.key: switch.default for switch in SWITCHES if switch.default is not None}
    set_by: dict[str, str] = {}
    for feature in variant.features:
        name = type(feature).__name__
        for key, value in feature.configuration(variant).items():
            if key not in feature.keys or key not in _BY_KEY:
                raise ValueError(f"{name} sets {key!r}, not among its keys {feature.keys} "
                                 "or not a Switch of configurations.SWITCHES")
            if key in set_by and config[key] != value:
                raise ValueError(f"variant {variant.name}: {set_by[key]} sets {key}="
                                 f"{config[key]}, {name} sets {key}={value}")
            config[key], set_by[key] = value, name
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
        raise ConfigError([f"no variant runs under {asked} (of {', '.join(names)})",
                           *missing_features([variants[name] for name in names], wanted)])
    return chosen, left_out


def _feature_file(cls: type) -> str:
    """``features/dspark.py``: where a feature class is written, from the package on."""
    return cls.__module__.removeprefix("overlap_harness.engines.sglang.").replace(".", "/") \
        + ".py"


def _setters(variants: list[Variant], key: str, value: str) -> list[type]:
    """The feature classes that set ``key`` to ``value`` in some variant of ``variants``."""
    found: list[type] = []
    for variant in variants:
        for feature in variant.features:
            if (feature.configuration(variant).get(key) == value
                    and type(feature) not in found):
                found.append(type(feature))
    return found


def missing_features(variants: list[Variant], wanted: dict[str, str]) -> list[str]:
    """Why no variant of ``variants`` runs under ``wanted``, as the feature that is missing.

    The nearest variants: fewest keys off, then most of the wanted keys applying to them,
    then the keys off as far down :data:`SWITCHES` as can be (a variant off in its
    speculative worker is farther than one off in its backend's host lengths). For each,
    the keys it runs otherwise and the feature of its own that sets each; then, per such
    key, what is missing: that feature configured with the wanted value, or, for the key
    a feature's presence fixes (its first key: ``Dspark`` always sets speculative=dspark),
    a feature that sets it so in some variant (or every feature that sets the key)."""
    from overlap_harness.engines.sglang.variants import FEATURE_ORDER

    order = {switch.key: index for index, switch in enumerate(SWITCHES)}

    def off(variant: Variant) -> list[str]:
        config = configuration(variant)
        return [key for key, value in wanted.items() if key in config and config[key] != value]

    def rank(variant: Variant) -> tuple[int, int, int]:
        config = configuration(variant)
        keys = off(variant)
        return (len(keys), -sum(key in config for key in wanted),
                -min((order[key] for key in keys), default=len(order)))

    best = min(rank(variant) for variant in variants)
    lines, missing = [], {}
    for variant in [v for v in variants if rank(v) == best][:3]:
        config = configuration(variant)
        parts = []
        for key in off(variant):
            setter = next((f for f in variant.features
                           if key in f.configuration(variant)), None)
            parts.append(f"{key}={config[key]} ("
                         + (f"set by its {type(setter).__name__})" if setter
                            else "no feature of it sets it)"))
            missing.setdefault(key, type(setter) if setter else None)
        lines.append(f"nearest: {variant.name} runs with {', '.join(parts)}")
    for key, cls in missing.items():
        value = wanted[key]
        if cls is not None and cls.keys[0] != key:
            lines.append(f"missing: a variant with {cls.__name__} setting {key}={value} "
                         f"({_feature_file(cls)}; docs/sglang-configurations.md)")
            continue
        candidates = (_setters(variants, key, value)
                      or [c for c in FEATURE_ORDER if key in c.keys])
        lines.append(f"missing: a variant with a feature setting {key}={value} ("
                     + (", ".join(f"{c.__name__}: {_feature_file(c)}" for c in candidates)
                        or "no feature sets it") + "; docs/sglang-configurations.md)")
    return lines


def describe(config: dict[str, str]) -> str:
    """``platform=cuda speculative=eagle ...``: a configuration on one line."""
    return " ".join(f"{key}={value}" for key, value in config.items())
