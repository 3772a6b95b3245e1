"""The recorder's check that a watched storage still lives (its block goes back to the pool
when it does not): true while any tensor holds the storage, false once the last is gone."""

from __future__ import annotations

import gc

import torch

from overlap_harness.recorder.dispatch import alive_test


def test_a_storage_is_alive_while_a_view_holds_it_and_dead_after() -> None:
    base = torch.zeros(8)
    alive = alive_test(base.untyped_storage())
    view = base[2:4]
    del base
    gc.collect()
    assert alive()  # the view still holds the storage
    del view
    gc.collect()
    assert not alive()


def test_the_check_does_not_keep_its_storage() -> None:
    tensor = torch.ones(4)
    checks = [alive_test(tensor.untyped_storage()) for _ in range(3)]
    assert all(check() for check in checks)
    del tensor
    assert not any(check() for check in checks)


def _freed_in_order(opaque_at: int | None) -> tuple[list[int], list[int]]:
    """Six storages allocated in a recording, four dropped in a shuffled order, then one
    sweep: the keys it freed, in order, and the keys still watched. ``opaque_at``: that
    storage's alive test is a plain callable (no torch weak reference to read directly)."""
    from overlap_harness.model.detector import HOST_AGENT
    from overlap_harness.recorder.core import Recording

    recording = Recording()
    freed: list[int] = []
    free = recording.free
    recording.free = lambda key: (freed.append(key), free(key))  # type: ignore[method-assign]
    tensors = {key: torch.zeros(4) for key in range(6)}
    for key, tensor in tensors.items():
        test = alive_test(tensor.untyped_storage())
        alive = (lambda test=test: test()) if key == opaque_at else test
        recording.allocate(key, 4, 4, torch.float32, (4,), True, HOST_AGENT, alive, f"t{key}")
    del tensor  # the loop's last one
    for key in (4, 1, 5, 3):
        del tensors[key]
    gc.collect()
    recording.sweep()
    return freed, sorted(recording.storages)


def test_a_sweep_frees_the_dead_storages_in_allocation_order_whatever_their_tests() -> None:
    fast = _freed_in_order(None)
    assert fast == ([1, 3, 4, 5], [0, 2])
    assert _freed_in_order(3) == fast  # one plain callable: every test is called
    assert _freed_in_order(2) == fast
