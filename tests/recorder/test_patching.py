"""``recorder.patching.patched``: every patch undone on exit, also when the block raises; an
attribute only inherited before is removed again (the class's own one shows through)."""

from __future__ import annotations

import pytest

from overlap_harness.recorder.patching import patched


class Base:
    def greet(self) -> str:
        return "base"


class Child(Base):
    label = "child"


def test_patches_are_undone_also_when_the_block_raises() -> None:
    with pytest.raises(KeyError), patched([(Child, "label", "patched"),
                                           (Child, "greet", lambda self: "patched")]):
        assert Child.label == "patched" and Child().greet() == "patched"
        raise KeyError("the block fails")
    assert Child.label == "child"
    assert "greet" not in vars(Child) and Child().greet() == "base"
