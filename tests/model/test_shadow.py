"""The detector's batched shadow memory (model/shadow.py, model/shadow_kernel.py): what the
independent oracle tests cannot reach by their program sizes, namely cells re-laid when a
ninth agent arrives, slots compacted when the slot arrays fill, checks split over several
batches, and clear errors for accesses the block cannot hold."""

from __future__ import annotations

import random

import numpy as np
import pytest

from overlap_harness.model import detector as detector_module
from overlap_harness.model import shadow as shadow_module
from overlap_harness.model.detector import AccessReq, HBDetector, NodeInfo
from overlap_harness.model.errors import DeviceUsageError
from overlap_harness.model.shadow_per_access import PerAccessShadow
from overlap_harness.model.trace import HOST, OpKind

NUMEL = 64


class Program:
    """Feeds an HBDetector directly: kernels on streams, record/wait pairs, host syncs."""

    def __init__(self, streams: int, checks: str = "compiled") -> None:
        self.det = HBDetector(checks=checks)
        self.det.add_storage(0, NUMEL, (NUMEL,))
        self.agents = [self.det.add_agent(f"s{k}") for k in range(streams)]
        self.op = 0

    def _info(self, agent: int, kind: OpKind) -> NodeInfo:
        name = HOST if agent == 0 else self.det.agent_names[agent]
        info = NodeInfo(self.op, f"n{self.op}", agent, name, kind, 0, "", None, 0, 0)
        self.op += 1
        return info

    def kernel(self, agent: int, elements: list[int], write: bool) -> int:
        op = self.op
        access = AccessReq(0, 0, "buf", np.array(elements, dtype=np.int64), write)
        self.det.on_op(self._info(agent, OpKind.KERNEL), [access])
        return op

    def fence(self, waiter: int, other: int) -> None:
        key = ("fence", self.op)
        self.det.on_record(key, self._info(other, OpKind.RECORD))
        self.det.on_wait(key, self._info(waiter, OpKind.WAIT))

    def sync(self, agent: int) -> None:
        last = self.det.last_op(agent)
        self.det.on_op(self._info(0, OpKind.HOST_SYNC), joins=[] if last is None else [last])

    def add_stream(self, name: str) -> int:
        return self.det.add_agent(name)

    def races(self) -> set[tuple]:
        return {(str(r.kind), r.first.op, r.second.op, r.elements, r.older)
                for r in self.det.races}


def test_a_stream_registered_after_the_first_accesses_still_races() -> None:
    prog = Program(streams=2)
    first = prog.kernel(1, [3, 4, 5], write=True)
    prog.det.check_queued()  # recorded in cells of 4 agent entries
    assert prog.det._shadow.stride == 4
    late = [prog.add_stream(f"late{k}") for k in range(6)]  # 9 agents: cells re-laid
    racing = prog.kernel(late[-1], [4, 5, 6], write=True)
    assert prog.races() == {("WAW", first, racing, (4, 5), False)}
    assert prog.det._shadow.stride >= 9


def test_its_fixed_twin_orders_the_two_writes() -> None:
    prog = Program(streams=2)
    prog.kernel(1, [3, 4, 5], write=True)
    prog.det.check_queued()
    late = [prog.add_stream(f"late{k}") for k in range(6)]
    prog.fence(late[-1], 1)
    prog.kernel(late[-1], [4, 5, 6], write=True)
    assert prog.races() == set()


def random_program(seed: int, steps: int, checks: str = "compiled") -> Program:
    """Three streams hammering one small block, fences dropped now and then: many races,
    many older pairs."""
    rng = random.Random(seed)
    prog = Program(streams=3, checks=checks)
    for _ in range(steps):
        choice = rng.random()
        agent = rng.choice(prog.agents)
        if choice < 0.75:
            prog.kernel(agent, rng.sample(range(NUMEL), rng.randint(1, 12)),
                        write=rng.random() < 0.5)
        elif choice < 0.95:
            prog.fence(agent, rng.choice(prog.agents))
        else:
            prog.sync(agent)
    return prog


@pytest.mark.parametrize("seed", range(6))
def test_compacted_slots_and_small_batches_find_the_same_races(monkeypatch, seed) -> None:
    whole = random_program(seed, 600).races()
    assert whole  # the program races: the comparison below has something to compare
    # few slots: the slot arrays fill and are compacted many times; short queues: many batches
    monkeypatch.setattr(shadow_module, "_FIRST_SLOTS", 16)
    monkeypatch.setattr(detector_module, "CHECK_EVERY", 7)
    prog = random_program(seed, 600)
    assert prog.races() == whole
    assert prog.det._shadow.compactions > 0


@pytest.mark.parametrize("checks", ["compiled", "per_access"])
def test_an_element_outside_the_block_is_a_clear_error(checks) -> None:
    prog = Program(streams=1, checks=checks)
    prog.kernel(1, [NUMEL], write=True)
    with pytest.raises(DeviceUsageError, match="outside its block of 64 elements"):
        prog.det.check_queued()


@pytest.mark.parametrize("checks", ["compiled", "per_access"])
def test_an_access_to_an_unregistered_block_is_a_clear_error(checks) -> None:
    det = HBDetector(checks=checks)
    agent = det.add_agent("s")
    access = AccessReq(7, 0, "ghost", np.array([0], dtype=np.int64), True)
    det.on_op(NodeInfo(0, "k", agent, "s", OpKind.KERNEL, 0, "", None, 0, 0), [access])
    with pytest.raises(DeviceUsageError, match="storage 7 before add_storage"):
        det.check_queued()


@pytest.mark.parametrize("seed", range(6))
def test_the_per_access_checks_find_the_compiled_pass_s_pairs_in_its_order(seed) -> None:
    compiled = Program(streams=3, checks="compiled")
    per_access = Program(streams=3, checks="per_access")
    for prog in (compiled, per_access):
        rng = random.Random(seed)
        for _ in range(400):
            agent = rng.choice(prog.agents)
            if rng.random() < 0.8:
                prog.kernel(agent, rng.sample(range(NUMEL), rng.randint(1, 12)),
                            write=rng.random() < 0.5)
            else:
                prog.fence(agent, rng.choice(prog.agents))
    rows = [[(str(r.kind), r.first.op, r.second.op, r.elements, r.older) for r in p.det.races]
            for p in (compiled, per_access)]
    assert rows[0] and rows[0] == rows[1]


def test_auto_picks_the_per_access_checks_for_a_short_run_and_the_pass_for_a_long_one(
        monkeypatch) -> None:
    monkeypatch.setattr(shadow_module, "_loaded", False)  # as in a fresh process
    monkeypatch.setattr(detector_module, "COMPILED_FROM", 8)
    short = Program(streams=2, checks="auto")
    short.kernel(1, [1], write=True)
    short.det.check_queued()
    assert isinstance(short.det._shadow, PerAccessShadow)
    long = Program(streams=2, checks="auto")
    for k in range(8):
        long.kernel(1, [k], write=True)
    long.det.check_queued()  # 8 nodes fed: a long run
    assert isinstance(long.det._shadow, shadow_module.ShadowMemory)
    # once loaded, even a short run uses the pass: it costs nothing more
    monkeypatch.setattr(detector_module, "COMPILED_FROM", 1 << 30)
    again = Program(streams=2, checks="auto")
    again.kernel(1, [1], write=True)
    again.det.check_queued()
    assert isinstance(again.det._shadow, shadow_module.ShadowMemory)


@pytest.mark.parametrize("seed", range(6))
def test_a_run_that_grows_long_moves_to_the_pass_with_the_same_pairs(monkeypatch,
                                                                     seed) -> None:
    def pairs(prog: Program) -> list[tuple]:
        return [(str(r.kind), r.first.op, r.second.op, r.elements, r.older)
                for r in prog.det.races]

    expected = [pairs(random_program(seed, 600, checks)) for checks in ("per_access", "compiled")]
    assert expected[0] and expected[0] == expected[1]
    monkeypatch.setattr(shadow_module, "_loaded", False)
    monkeypatch.setattr(detector_module, "CHECK_EVERY", 16)  # many checks before and after
    monkeypatch.setattr(detector_module, "COMPILED_FROM", 300)
    kinds = []
    original = detector_module.HBDetector._shadow_memory

    def noted(self):
        memory = original(self)
        kinds.append(type(memory).__name__)
        return memory

    monkeypatch.setattr(detector_module.HBDetector, "_shadow_memory", noted)
    prog = random_program(seed, 600, "auto")
    got = pairs(prog)
    assert kinds[0] == "PerAccessShadow" and kinds[-1] == "ShadowMemory"
    assert got == expected[0]


def test_a_batch_of_many_elements_is_checked_in_parts_with_the_same_pairs(monkeypatch) -> None:
    whole = random_program(3, 500).races()
    monkeypatch.setattr(shadow_module, "MAX_BATCH_ELEMENTS", 40)  # a few nodes a part
    calls = []
    original = shadow_module.ShadowMemory.check

    def counted(self, ops, *rest):
        calls.append(len(ops))
        return original(self, ops, *rest)

    monkeypatch.setattr(shadow_module.ShadowMemory, "check", counted)
    assert random_program(3, 500).races() == whole
    assert max(calls) > 40 > min(calls)  # the queue came in whole and was checked in parts


def test_without_numba_a_long_run_checks_one_access_at_a_time(monkeypatch) -> None:
    monkeypatch.setattr(detector_module, "compiled_available", lambda: False)
    monkeypatch.setattr(detector_module, "CHECK_EVERY", 8)
    long = Program(streams=2, checks="auto")
    for k in range(8):
        long.kernel(1, [k], write=True)
    assert isinstance(long.det._shadow, PerAccessShadow)
