"""Skip a vLLM test module where vLLM does not import, or where the loaded tree lacks the code
of the variant it tests (the reason is the one ``overlap-harness vllm`` gives)."""

from __future__ import annotations

import pytest

from overlap_harness.engines.vllm.environment import VllmUnavailable, import_vllm


def require_variant(variant: str) -> None:
    """Skip the calling module unless vLLM imports and its tree can run ``variant``."""
    try:
        import_vllm()
    except VllmUnavailable as exc:
        pytest.skip(str(exc), allow_module_level=True)
    from overlap_harness.engines.vllm.release_features import not_applicable_reason

    if (reason := not_applicable_reason(variant)) is not None:
        pytest.skip(reason, allow_module_level=True)
