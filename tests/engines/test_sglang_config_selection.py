"""``--config KEY=VALUE``: the variants of one SGLang configuration (configurations.py).

The configurations are computed from the variants' features (each feature's
``configuration`` hook); these tests check them against the features' fields read directly
(not through the code under test) and against the configurations the committed loop report
recorded before variants were made of features, the selection's rule (a key that does not
apply to a variant does not leave it out), and every bad input's line. SGLang itself is not
needed: the selection happens before the tree is loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from overlap_harness.engines.sglang import configurations
from overlap_harness.engines.sglang.features.decode_graph import CudaGraphDecode
from overlap_harness.engines.sglang.features.dspark import Dspark
from overlap_harness.engines.sglang.features.eagle import Eagle
from overlap_harness.engines.sglang.features.eagle_verify_graph import CudaGraphVerify
from overlap_harness.engines.sglang.features.hip import Hip
from overlap_harness.engines.sglang.features.multi_layer_eagle import MultiLayerEagle
from overlap_harness.engines.sglang.features.radix_cache import RadixCache
from overlap_harness.engines.sglang.variants import VARIANTS, Variant

LOOP_REPORTS = sorted((Path(__file__).resolve().parents[2] / "reports/conformance")
                      .glob("sglang-0.5.2*-loop.json"))


def test_every_variant_states_its_configuration_from_its_own_features():
    for name, variant in VARIANTS.items():
        config = configurations.configuration(variant)
        multi_layer = variant.feature(MultiLayerEagle)
        eagle, dspark = variant.feature(Eagle) or multi_layer, variant.feature(Dspark)
        assert config["platform"] == ("hip" if variant.has(Hip) else "cuda"), name
        speculative = ("eagle" if eagle is not None
                       else "dspark" if dspark is not None else "none")
        assert config["speculative"] == speculative, name
        if dspark is not None:
            assert config["ragged_verify"] == dspark.ragged_verify_mode.value, name
            assert config["plan_stream"] == "off" and "eagle_topk" not in config, name
        elif eagle is None:
            assert "plan_stream" not in config and "eagle_topk" not in config, name
            assert "ragged_verify" not in config, name
        else:
            assert config["plan_stream"] == ("on" if eagle.plan_stream else "off")
            assert config["eagle_topk"] == str(eagle.topk)
            assert config.get("multi_layer_eagle") == ("on" if multi_layer else None), name
        assert config["radix_cache"] == ("on" if variant.has(RadixCache) else "off"), name
        graphs = variant.has(CudaGraphDecode) or variant.has(CudaGraphVerify)
        assert (config["cuda_graph"] != "off") == graphs, name
        for key, value in config.items():
            switch = next(s for s in configurations.SWITCHES if s.key == key)
            assert value in switch.values, (name, key, value)


@pytest.mark.parametrize("report", LOOP_REPORTS, ids=lambda path: path.name)
def test_the_configurations_are_those_the_committed_loop_reports_recorded(report):
    """Each variant of a committed loop report has the configuration recorded there (the
    reports were written before variants were composed of features; an older report lacks
    the keys added since, such as unified_memory)."""
    recorded = json.loads(report.read_text())["configurations"]
    assert recorded
    for name, config in recorded.items():
        computed = configurations.configuration(VARIANTS[name])
        assert {key: computed.get(key) for key in config} == config, name


def test_two_features_setting_one_key_differently_are_refused():
    variant = Variant("graph_and_verify", 1, {}, (CudaGraphDecode(), Eagle(),
                                                 CudaGraphVerify()))
    with pytest.raises(ValueError, match="cuda_graph"):
        configurations.configuration(variant)


def test_plan_stream_off_keeps_the_variants_without_speculation():
    names = list(VARIANTS)
    chosen, left_out = configurations.select(VARIANTS, names,
                                             configurations.parse(["plan_stream=off"]))
    for name in names:
        eagle = VARIANTS[name].feature(Eagle) or VARIANTS[name].feature(MultiLayerEagle)
        expected_in = eagle is None or not eagle.plan_stream
        assert (name in chosen) == expected_in, name
        if not expected_in:
            assert left_out[name] == ("runs with plan_stream=on; --config asks "
                                      "plan_stream=off")
    assert set(chosen) | set(left_out) == set(names)


def test_two_keys_leave_out_what_differs_in_either():
    wanted = configurations.parse(["speculative=none", "cuda_graph=decode"])
    chosen, left_out = configurations.select(VARIANTS, list(VARIANTS), wanted)
    assert chosen and all(VARIANTS[n].speculative is None and VARIANTS[n].has(CudaGraphDecode)
                          for n in chosen)
    assert all("--config asks" in reason for reason in left_out.values())


@pytest.mark.parametrize(("items", "problem"), [
    (["plan_stream"], "--config 'plan_stream': expected KEY=VALUE, e.g. plan_stream=off"),
    (["colour=red"], "--config 'colour=red': no key 'colour' (keys: "),
    (["plan_stream=maybe"], "--config 'plan_stream=maybe': plan_stream takes on|off, got "
                            "'maybe'"),
    (["plan_stream=on", "plan_stream=off"],
     "--config 'plan_stream=off': plan_stream already asked as 'on'"),
])
def test_a_bad_config_says_what_is_accepted(items, problem):
    with pytest.raises(configurations.ConfigError) as caught:
        configurations.parse(items)
    [line] = caught.value.problems
    assert line.startswith(problem), line


def test_a_selection_no_variant_has_is_refused():
    wanted = configurations.parse(["speculative=eagle"])
    with pytest.raises(configurations.ConfigError, match="no variant runs under "
                       "--config speculative=eagle"):
        configurations.select(VARIANTS, ["non_spec_decode"], wanted)


@pytest.mark.engine_run
def test_the_command_prints_every_bad_config_on_its_own_line_and_exits_2():
    done = subprocess.run([sys.executable, "-m", "overlap_harness", "sglang",
                           "--config", "plan_stream=maybe", "--config", "nokey=1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "overlap-harness sglang: --config 'plan_stream=maybe': plan_stream takes on|off, "
        "got 'maybe'",
        "overlap-harness sglang: --config 'nokey=1': no key 'nokey' (keys: "
        + ", ".join(s.key for s in configurations.SWITCHES) + ")"]


@pytest.mark.parametrize(("items", "expected"), [
    # EAGLE with the plan stream off and backends that need host lengths (issue 41)
    (["speculative=eagle", "plan_stream=off", "cpu_seq_lens=on"],
     {"eagle_d2h_stream_plan_off", "eagle_topk4_d2h_stream_plan_off"}),
    # DSpark with backends that need none
    (["speculative=dspark", "cpu_seq_lens=off"], {"dspark_no_host_lengths"}),
    # SGLang's multi-layer worker (the key applies to its variants only)
    (["speculative=eagle", "multi_layer_eagle=on"],
     {name for name, v in VARIANTS.items() if v.feature(Eagle) is not None}
     | {name for name, v in VARIANTS.items() if v.feature(MultiLayerEagle) is not None}),
])
def test_the_configurations_users_run_select_their_variants(items, expected):
    """Each selects exactly the variants whose features say so (read here directly)."""
    wanted = configurations.parse(items)
    chosen, _left_out = configurations.select(VARIANTS, list(VARIANTS), wanted)
    assert set(chosen) == expected
    for name in chosen:
        variant = VARIANTS[name]
        spec = (variant.feature(Eagle) or variant.feature(MultiLayerEagle)
                or variant.feature(Dspark))
        assert spec is not None, name
        if wanted.get("cpu_seq_lens"):
            assert spec.needs_cpu_seq_lens == (wanted["cpu_seq_lens"] == "on"), name
