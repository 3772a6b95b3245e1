"""The protocol's op functions are device code (CudaDevice runs ``fn(*live tensors)`` at issue,
inside the stream context): no value may leave the device (``int()``, ``.item()``,
``.tolist()``, ``bool()``, iterating a tensor), no tensor may be made on the default (CPU)
device next to the inputs, and the result may not depend on the inputs' strides.

Checked on CPU: every launch of whole protocol runs is re-executed under a torch function
mode that refuses those calls, on non-contiguous copies of its inputs, and must give the same
values; plus a static scan of the closures handed to ``launch``."""

from __future__ import annotations

import ast
import dataclasses as dc
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from overlap_harness.model.config import EventKind as EK
from overlap_harness.model.config import (
    Gather,
    Mode,
    ProtocolConfig,
    Request,
    StashStream,
    Timing,
    WarBarrier,
    Workload,
    WorkloadEvent,
)
from overlap_harness.model.protocol import compare_runs, run_protocol
from overlap_harness.sim.sim_device import SimDevice

HOST_ONLY = {"__int__", "__float__", "__bool__", "__index__", "item", "tolist", "numpy", "cpu",
             "unbind", "__iter__", "__len__"}
FACTORIES = {torch.arange, torch.zeros, torch.ones, torch.full, torch.empty, torch.tensor,
             torch.eye, torch.randint, torch.rand}


class DeviceCodeMode(TorchFunctionMode):
    """Refuses host syncs and default-device factories inside one op function."""

    def __init__(self, op: str) -> None:
        super().__init__()
        self.op = op

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name in HOST_ONLY:
            raise AssertionError(f"op {self.op!r}: {name} moves a device value to the host")
        if (func in FACTORIES or (func is torch.as_tensor and not isinstance(args[0], torch.Tensor))
                ) and "device" not in kwargs:
            raise AssertionError(f"op {self.op!r}: torch.{name} without device= makes a CPU "
                                 "tensor next to device inputs")
        return func(*args, **kwargs)


def strided(v):
    """A non-contiguous copy of ``v`` (every other element of a wider buffer)."""
    if not isinstance(v, torch.Tensor) or v.dim() == 0:
        return v
    wide = torch.empty((*v.shape, 2), dtype=v.dtype)
    out = wide.select(-1, 0)
    out.copy_(v)
    assert not out.is_contiguous() or v.numel() <= 1
    return out


def same(a, b) -> bool:
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a, b))
    return a == b


class CheckedDevice(SimDevice):
    """SimDevice that re-runs every op function as device code and compares the values."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.checked: set[str] = set()

    def launch(self, stream, name, fn, reads=(), writes=(), cost_us=0.0, observe=None):
        def checked(*vals):
            ref = fn(*vals)
            if vals:  # a function with no inputs returns host constants the device stages
                copies = [strided(v) for v in vals]
                with DeviceCodeMode(name):
                    got = fn(*copies)
                assert same(ref, got), f"op {name!r} depends on its inputs' strides"
                self.checked.add(name)
            return ref

        super().launch(stream, name, checked, reads, writes, cost_us, observe)


R = Request
MIXED = Workload(
    iterations=10,
    requests=(R("A", 0, 10, 30), R("B", 0, 6, 5), R("C", 2, 20, 6, chunks=3), R("D", 5, 4, 30),
              R("X", 6, 5, 30)),
    events=(WorkloadEvent(4, EK.RETRACT, "A"), WorkloadEvent(6, EK.MIXED_CHUNK, "X"),
            WorkloadEvent(1, EK.DOUBLE_STASH, "A"), WorkloadEvent(8, EK.IDLE)),
)
SPEC_OPS = {"prefill_forward", "draft_prefill", "publish", "stash", "gather_spec_extras",
            "draft_out_cache_loc", "draft", "verify_out_cache_loc", "verify", "draft_extend",
            "gather_seq_lens", "assert_seq_lens", "repoison_seq_lens", "assert_invalidate",
            "release_kv", "stash_replay"}
CONFIGS = {
    "ref": (ProtocolConfig(debug_poison=True), SPEC_OPS, ()),
    "topk2_plan_side_swa": (
        ProtocolConfig(gather=Gather.UNFUSED, topk=2, num_steps=2, num_draft_tokens=4,
                       hidden_states=False, plan_stream=True, stash_stream=StashStream.SIDE,
                       swa=True, war_barrier=WarBarrier.AFTER_LAUNCH, debug_poison=True),
        SPEC_OPS - {"gather_spec_extras"} | {"plan_metadata", "gather_bonus", "gather_topk_p"},
        ()),
    "nonspec_mixed_delayed": (
        ProtocolConfig(mode=Mode.NON_SPEC, delayed_sampling=True, swa=True, debug_poison=True),
        {"decode_forward", "gather_output_tokens", "sample", "assert_invalidate", "publish",
         "stash"}, ()),
    "racy_forward_entry": (
        ProtocolConfig(gather=Gather.UNFUSED),
        SPEC_OPS - {"assert_seq_lens", "repoison_seq_lens", "assert_invalidate",
                    "gather_spec_extras"} | {"gather_bonus"},
        ("forward_entry",)),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_op_function_is_device_code(name) -> None:
    proto, must, removed = CONFIGS[name]
    wl = MIXED if proto.mode == Mode.NON_SPEC else dc.replace(
        MIXED, events=tuple(e for e in MIXED.events if e.kind != EK.MIXED_CHUNK))
    dev = CheckedDevice(removed=removed)
    out = run_protocol(dev, (proto, wl, Timing()))
    dev.finish()
    assert must <= dev.checked, sorted(must - dev.checked)
    plain = SimDevice(removed=removed)
    p_out = run_protocol(plain, (proto, wl, Timing()))
    plain.finish()
    assert compare_runs(out, dev.observations, p_out, plain.observations) == []


# -- static: the closures handed to launch ----------------------------------------------------

PROTOCOL = Path(__file__).resolve().parents[2] / "model" / "protocol"
BANNED_CALLS = {"int", "float", "bool"}
BANNED_METHODS = {"item", "tolist", "numpy", "cpu"}
HOST_FUNCTIONS = {"prompt_token"}  # synth helpers the host calls, never inside an op


def _violations(node: ast.AST) -> list[str]:
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Name) and f.id in BANNED_CALLS:
                out.append(f"{f.id}() at line {n.lineno}")
            if isinstance(f, ast.Attribute) and f.attr in BANNED_METHODS:
                out.append(f".{f.attr}() at line {n.lineno}")
    return out


def _device_code(tree: ast.Module, module: str) -> list[ast.AST]:
    """Nested functions and lambdas inside functions (the op closures); in synth.py every
    top-level function but the host-only ones (the op closures call them)."""
    found: list[ast.AST] = []
    for top in tree.body:
        funcs = [top] if isinstance(top, ast.FunctionDef) else [
            b for b in getattr(top, "body", []) if isinstance(b, ast.FunctionDef)]
        for f in funcs:
            if module == "synth.py" and f.name not in HOST_FUNCTIONS:
                found.append(f)
            found += [n for n in ast.walk(f) if n is not f
                      and isinstance(n, ast.FunctionDef | ast.Lambda)]
    return found


@pytest.mark.parametrize("module", ["synth.py", "worker.py", "future_map.py", "run_batch.py",
                                    "scheduler.py"])
def test_op_closures_never_pull_values_to_the_host(module) -> None:
    tree = ast.parse((PROTOCOL / module).read_text())
    bad = [v for node in _device_code(tree, module) for v in _violations(node)]
    assert bad == [], f"{module}: {bad}"
