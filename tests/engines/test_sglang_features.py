"""Variants composed of features (engines/sglang/features/api.py): the hooks' rules, the
configuration page generated from the features, and ``--config``'s answer naming the
missing feature. SGLang is not needed (nothing here builds a scheduler)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from overlap_harness.engines.sglang import configurations, coverage, release_features
from overlap_harness.engines.sglang.features.api import Feature
from overlap_harness.engines.sglang.features.chunked_prefill import ChunkedPrefill
from overlap_harness.engines.sglang.features.dspark import Dspark
from overlap_harness.engines.sglang.features.eagle import Eagle
from overlap_harness.engines.sglang.features.grammar import Grammar
from overlap_harness.engines.sglang.features.hip import Hip
from overlap_harness.engines.sglang.variants import FEATURE_ORDER, VARIANTS, Variant

ROOT = Path(__file__).resolve().parents[2]


def test_every_feature_sets_only_switch_keys_and_its_first_key_is_fixed() -> None:
    """A feature's keys are configuration switches; its first key has one value in every
    variant it is in (what ``--config``'s missing-feature answer relies on)."""
    switches = {switch.key for switch in configurations.SWITCHES}
    for cls in FEATURE_ORDER:
        assert set(cls.keys) <= switches, cls.__name__
        values = {v.feature(cls).configuration(v)[cls.keys[0]]
                  for v in VARIANTS.values() if v.has(cls) and cls.keys}
        assert len(values) <= 1, (cls.__name__, values)


def test_every_feature_class_is_used_by_a_default_variant() -> None:
    used = {type(f) for v in VARIANTS.values() for f in v.features}
    assert used == set(FEATURE_ORDER)


def test_a_variant_keeps_its_features_in_the_drivers_order() -> None:
    variant = Variant("x", 1, {}, (Grammar(), Eagle(), ChunkedPrefill(), Hip()))
    assert [type(f) for f in variant.features] == [Hip, ChunkedPrefill, Eagle, Grammar]
    assert variant.speculative == Eagle() and variant.feature(Dspark) is None


@pytest.mark.parametrize(("features", "problem"), [
    ((Eagle(), Dspark()), "two speculative workers"),
    ((Eagle(), Eagle(topk=4)), "listed twice"),
    ((Feature(),), "not in variants.FEATURE_ORDER"),
])
def test_a_variant_refuses_features_that_cannot_be_composed(features, problem) -> None:
    with pytest.raises(ValueError, match=problem):
        Variant("x", 1, {}, features)


def test_release_features_come_from_the_features_each_once() -> None:
    needs = release_features.required_features(VARIANTS["eagle_mixed_hip"])
    assert needs == [release_features.OVERLAP_LOOP, release_features.HIP_BRANCHES,
                     release_features.EAGLE_V2, release_features.MIXED_SPEC_TAILS]
    grammar = release_features.required_features(
        Variant("g", 1, {}, (Grammar(), *VARIANTS["delay_sample"].features)))
    assert grammar.count(release_features.DELAYED_SAMPLE) == 1


def test_the_configuration_page_is_what_the_tool_writes() -> None:
    """docs/sglang-configurations.md is generated from the features (the tool's --check)."""
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "sglang_configurations_page.py"),
                           "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    page = (ROOT / coverage.PAGE).read_text()
    for cls in FEATURE_ORDER:
        assert f"`{cls.__name__}`" in page
    for item in coverage.NOT_DRIVEN:
        assert item.option in page


def test_a_configuration_no_variant_runs_names_the_missing_feature() -> None:
    wanted = configurations.parse(["speculative=dspark", "cpu_seq_lens=off"])
    with pytest.raises(configurations.ConfigError) as caught:
        configurations.select(VARIANTS, list(VARIANTS), wanted)
    first, *why = caught.value.problems
    assert first.startswith("no variant runs under --config speculative=dspark "
                            "--config cpu_seq_lens=off")
    assert why == ["nearest: dspark_confidence_relay runs with cpu_seq_lens=on (set by its "
                   "Dspark)",
                   "missing: a variant with Dspark setting cpu_seq_lens=off "
                   "(features/dspark.py; docs/sglang-configurations.md)"]


def test_a_value_no_feature_of_the_nearest_sets_names_the_features_that_set_it() -> None:
    wanted = configurations.parse(["grammar=on", "cuda_graph=decode"])
    with pytest.raises(configurations.ConfigError) as caught:
        configurations.select(VARIANTS, list(VARIANTS), wanted)
    assert caught.value.problems[-1] == (
        "missing: a variant with a feature setting grammar=on (Grammar: features/grammar.py; "
        "docs/sglang-configurations.md)")
    assert all("runs with grammar=off (no feature of it sets it)" in line
               for line in caught.value.problems[1:-1])


def test_the_not_driven_options_name_files_of_the_installed_sglang() -> None:
    """Each option known and not driven names the SGLang file that selects it; where SGLang
    is installed, that file is there."""
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("sglang is not installed")
    srt = Path(spec.submodule_search_locations[0]) / "srt"
    for item in coverage.NOT_DRIVEN:
        for name in re.findall(r"\(([\w/]+\.py)", item.selects):
            assert any(srt.glob(f"**/{name}")), (item.option, name)
