"""Which vLLM code each variant drives, and whether the loaded tree has it.

vLLM's releases differ in what they ship: 0.34.0 dropped the V1 GPU model runner
(``vllm/v1/worker/gpu_model_runner.py``), so only Model Runner V2 (``vllm/v1/worker/gpu/``)
is left; a release older than Model Runner V2 has no ``gpu/`` package. A variant whose code
the tree lacks is not applicable there, with the reason, and the others still run. The
answer comes from the tree (a module found, a name defined), never from its version.

A need is written ``"module:Name.attribute"`` (the module alone when there is no name).
"""

from __future__ import annotations

import importlib
import importlib.util

V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
MRV2 = "vllm.v1.worker.gpu"
#: what each need is, in words, for the reason a variant is not applicable
WHAT = {
    V1_RUNNER: "the V1 GPU model runner",
    f"{MRV2}.async_utils": "Model Runner V2's async output copy",
    f"{MRV2}.buffer_utils": "Model Runner V2's UVA buffers",
    f"{MRV2}.pp_utils": "Model Runner V2's pipeline-parallel handler",
    f"{MRV2}.spec_decode": "Model Runner V2's speculative decoding",
    "vllm.v1.worker.mm_encoder_model_runner": "Model Runner V2's encoder-only runner",
    "vllm.v1.utils": "vLLM's CpuGpuBuffer",
}
_V1_OUTPUT = f"{V1_RUNNER}:AsyncGPUModelRunnerOutput.get_output"
_MRV2_OUTPUT = f"{MRV2}.async_utils:AsyncOutput.get_output"
_RING = f"{MRV2}.buffer_utils:StagedWriteTensor.apply_write"

#: the code each variant drives (a variant not listed needs nothing beyond the engine core)
NEEDS: dict[str, tuple[str, ...]] = {
    "v1-async-output": (_V1_OUTPUT,),
    "v1-input-prep": (f"{V1_RUNNER}:GPUModelRunner.synchronize_input_prep",
                      "vllm.v1.utils:CpuGpuBuffer.copy_to_gpu"),
    "mrv2-uva-ring": (_RING, _MRV2_OUTPUT),
    "v1-pooling": (f"{V1_RUNNER}:AsyncGPUPoolingModelRunnerOutput.get_output",),
    "mrv2-pooling": (f"{MRV2}.async_utils:AsyncPoolingOutput.get_output",),
    "v1-spec-decode": (f"{V1_RUNNER}:GPUModelRunner._copy_draft_token_ids_to_cpu",
                       _V1_OUTPUT),
    "engine-core": (_RING, _MRV2_OUTPUT),
    "chunked-prefill": (f"{V1_RUNNER}:GPUModelRunner.synchronize_input_prep", _V1_OUTPUT,
                        "vllm.v1.utils:CpuGpuBuffer.copy_to_gpu"),
    "mrv2-spec-decode": (_MRV2_OUTPUT, f"{MRV2}.spec_decode.utils:DraftTokensHandler",
                         f"{MRV2}.spec_decode.adaptive_verification:"
                         "AdaptiveVerificationManager.record_confidences"),
    "pp-batch-queue": (_RING, _MRV2_OUTPUT, f"{MRV2}.pp_utils:PPHandler.receive"),
    "v1-hybrid-spec-decode": (f"{V1_RUNNER}:GPUModelRunner._update_states_after_model_execute",),
    "v1-hybrid-spec-decode-sync": (
        f"{V1_RUNNER}:GPUModelRunner._update_states_after_model_execute",),
    "v1-hybrid-spec-decode-async-none": (
        f"{V1_RUNNER}:GPUModelRunner._update_states_after_model_execute",),
    "mrv2-encoder-only": (
        "vllm.v1.worker.mm_encoder_model_runner:MMEncoderModelRunner.input_tensor_semaphore",
        _RING),
}


def missing(need: str) -> str | None:
    """What of ``need`` the loaded tree lacks (``no module M`` or ``M has no X``), None when
    it has all of it."""
    module_name, _, dotted = need.partition(":")
    try:
        found = importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        found = False
    if not found:
        return f"no module {module_name}"
    value: object = importlib.import_module(module_name)
    owner = module_name
    for name in filter(None, dotted.split(".")):
        if not hasattr(value, name):
            return f"{owner} has no {name}"
        value = getattr(value, name)
        owner = f"{owner}:{name}" if owner == module_name else f"{owner}.{name}"
    return None


def _what(need: str) -> str:
    module_name = need.partition(":")[0]
    for prefix in sorted(WHAT, key=len, reverse=True):
        if module_name == prefix or module_name.startswith(prefix + "."):
            return WHAT[prefix]
    return module_name


def not_applicable_reason(variant: str) -> str | None:
    """Why ``variant`` cannot run on the loaded tree (each need it lacks, in words and by
    name), None when it can."""
    lacking = list(dict.fromkeys(f"{_what(need)} ({why})" for need in NEEDS.get(variant, ())
                                 if (why := missing(need)) is not None))  # each once
    return "the tree lacks " + "; ".join(lacking) if lacking else None
