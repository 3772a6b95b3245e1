"""Which variants a vLLM tree can run is read from the tree (a module found, a name
defined), never from its version: checked here on the standard library, so it runs without
vLLM."""

from __future__ import annotations

import pytest

from overlap_harness.engines.vllm import release_features
from overlap_harness.engines.vllm.release_features import missing, not_applicable_reason


def test_a_need_the_tree_has_is_not_missing() -> None:
    assert missing("json") is None
    assert missing("json:JSONDecoder.decode") is None


@pytest.mark.parametrize(("need", "why"), [
    ("no_such_module_here", "no module no_such_module_here"),
    ("no_such_package_here.sub", "no module no_such_package_here.sub"),
    ("json:NoSuchClass", "json has no NoSuchClass"),
    ("json:JSONDecoder.no_such_method", "json:JSONDecoder has no no_such_method"),
])
def test_what_a_tree_lacks_is_named(need: str, why: str) -> None:
    assert missing(need) == why


def test_a_variant_is_not_applicable_with_each_need_it_lacks(monkeypatch) -> None:
    monkeypatch.setattr(release_features, "NEEDS", {
        "ok": ("json:dumps",),
        "v1-like": ("json:dumps", "vllm_gone.v1.worker.gpu_model_runner:GPUModelRunner",
                    "json:nothing"),
    })
    assert not_applicable_reason("ok") is None
    assert not_applicable_reason("needs-nothing") is None
    assert not_applicable_reason("v1-like") == (
        "the tree lacks vllm_gone.v1.worker.gpu_model_runner (no module "
        "vllm_gone.v1.worker.gpu_model_runner); json (json has no nothing)")


def test_every_variant_names_what_it_drives() -> None:
    from overlap_harness.engines.vllm.necessity import variant_runs

    assert set(release_features.NEEDS) == set(variant_runs())
