"""The vLLM environment: refused once vLLM's CPU worker has erased torch's streams; inside
``cuda_selected`` vLLM sees a strict CUDA platform and pinned memory, all undone after."""

from __future__ import annotations

import sys
import types

import pytest

from overlap_harness.engines.core.strict import UnplannedUseError
from overlap_harness.engines.vllm import environment
from overlap_harness.engines.vllm.environment import VllmUnavailable
from overlap_harness.recorder import watch


def test_refused_once_the_cpu_worker_replaced_torchs_streams(monkeypatch):
    monkeypatch.setitem(sys.modules, environment.ERASING_MODULE,
                        types.ModuleType(environment.ERASING_MODULE))
    with pytest.raises(VllmUnavailable, match="no protocol can be checked"):
        environment.import_vllm()


def test_the_strict_platform_answers_as_cuda_and_refuses_the_rest():
    platform = environment.cuda_platform()
    assert platform.is_cuda_alike() and platform.is_pin_memory_available()
    assert not platform.is_cpu() and platform.device_type == "cuda"
    with pytest.raises(UnplannedUseError, match="use_custom_allreduce"):
        platform.use_custom_allreduce()


def test_cuda_selected_is_undone_on_exit():
    try:
        environment.import_vllm()
    except VllmUnavailable as exc:
        pytest.skip(str(exc))
    import torch
    import vllm.platforms
    from vllm.utils.platform_utils import is_pin_memory_available, is_uva_available
    from vllm.v1 import utils as v1_utils

    before = vllm.platforms.current_platform
    with watch("cpu") as w, environment.cuda_selected(w) as selected:
        assert vllm.platforms.current_platform is selected and is_uva_available()
        assert is_pin_memory_available()
        assert v1_utils.PIN_MEMORY is True
        pinned = torch.zeros(2, pin_memory=True)
        assert torch.ops._C.get_cuda_view_from_cpu_tensor(pinned).is_cuda
    assert vllm.platforms.current_platform is before
    assert v1_utils.PIN_MEMORY is False and not is_pin_memory_available()
    assert "get_cuda_view_from_cpu_tensor" not in vars(torch.ops._C)
