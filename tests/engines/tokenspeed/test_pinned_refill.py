"""The pinned-buffer refill TokenSpeed fixed upstream (lightseekorg/tokenspeed #689, July
2026: the extend lengths staged through persistent pinned host buffers, refilled for step N+1
while step N's non-blocking upload from them may still be queued; fixed by a fresh pinned
block per call, ``InputBuffers._bulk_pinned``). Both released wheels (0.1.0, 0.1.1) hold the
fixed code, so the pre-fix lines are put back into a copy of the installed tree: the refill
races its upload in the variants with consecutive extends, at those lines; the released code
(the fixed twin) is race-free (test_loop)."""

from __future__ import annotations

from pathlib import Path

from tests.engines.tokenspeed.conftest import run_command, tree_copy

BUFFERS = "runtime/execution/input_buffer.py"
PRE_FIX = [
    ("""        self.extend_prefix_lens_cpu = torch.zeros(max_bs, dtype=torch.int32)
        self.extend_seq_lens_cpu = torch.zeros(max_bs, dtype=torch.int32)""",
     """        self.extend_prefix_lens_cpu = torch.zeros(
            max_bs, dtype=torch.int32, pin_memory=True
        )
        self.extend_seq_lens_cpu = torch.zeros(
            max_bs, dtype=torch.int32, pin_memory=True
        )"""),
    ("""            ext_prefix_cpu, ext_seq_cpu = self._bulk_pinned(
                (num_extends, torch.int32), (num_extends, torch.int32)
            )
            ext_prefix_cpu.copy_(self.extend_prefix_lens_cpu[:num_extends])
            ext_seq_cpu.copy_(self.extend_seq_lens_cpu[:num_extends])
            self.extend_prefix_lens_buf[:num_extends].copy_(
                ext_prefix_cpu, non_blocking=True
            )
            self.extend_seq_lens_buf[:num_extends].copy_(ext_seq_cpu, non_blocking=True)""",
     """            self.extend_prefix_lens_buf[:num_extends].copy_(
                self.extend_prefix_lens_cpu[:num_extends], non_blocking=True
            )
            self.extend_seq_lens_buf[:num_extends].copy_(
                self.extend_seq_lens_cpu[:num_extends], non_blocking=True
            )"""),
]


def test_the_reintroduced_refill_races_its_pending_upload(tokenspeed_tree: Path,
                                                          tmp_path: Path) -> None:
    tree = tree_copy(tokenspeed_tree, tmp_path / "tree", {BUFFERS: PRE_FIX})
    status, document = run_command(tree, tmp_path / "out.json", "chunked_prefill",
                                   "plain_decode", "no_overlap")
    assert status == 1, document["stderr"]
    racing = {race["variant"] for race in document["races"]}
    assert racing == {"chunked_prefill"}  # decode-only and depth-0 rounds do not overlap it
    buffers = f"tokenspeed/{BUFFERS}"  # named from the tree's root
    tensors = {race["tensor"].split("@")[0] for race in document["races"]}
    assert tensors == {"self.extend_prefix_lens_cpu", "self.extend_seq_lens_cpu"}
    for race in document["races"]:
        assert {race["first"]["file"], race["second"]["file"]} == {buffers}
