"""The buffers the protocol allocates, by name: what ``races = ["KIND buffer"]`` may name.

A race expectation names a buffer; a name the protocol never allocates can never match a
race, so a typo (``new_seq_lens_bf``) would read as a verdict mismatch after the run. The
loader checks each name against :data:`PROTOCOL_BUFFERS` instead and says which names exist.

The list is the union over every configuration (a buffer such as ``topk_p_buf`` exists only
in some). tests/scenarios/test_loader.py runs every bundled scenario and fails when the
protocol allocates a name missing here, so the list follows the model.
"""

from __future__ import annotations

import difflib
import re

from overlap_harness.model.config import Scenario
from overlap_harness.scenarios.rules import Problems
from overlap_harness.scenarios.schema import show

PROTOCOL_BUFFERS: tuple[str, ...] = (
    "accept_lens", "accept_lens_cpu", "assert_flags", "assert_flags_cpu", "bonus_tokens",
    "confidence_buf", "draft_out_cache_loc", "draft_tokens", "full_to_swa_index_mapping",
    "future_indices", "future_indices_out", "grammar_mask", "hidden_states",
    "hidden_states_buf", "input_ids", "kv_cache", "logits", "mix_running_indices",
    "mixed_tail_lens", "mixed_tail_lens_cpu", "mixed_tail_out_cache_loc", "new_seq_lens",
    "new_seq_lens_buf", "new_seq_lens_cpu_pinned", "next_hidden", "next_token_ids",
    "next_tokens", "next_tokens_cpu", "next_topk_index", "next_topk_p", "out_cache_loc",
    "out_tokens", "out_tokens_cpu", "output_tokens_buf", "plan_metadata", "prefill_ids_pinned",
    "prefill_input_ids", "req_to_token", "seq_lens", "seq_lens_cpu", "seq_lens_flags",
    "seq_lens_flags_cpu", "topk_index", "topk_index_buf", "topk_p", "topk_p_buf",
)
"""Every buffer name the protocol allocates, besides the numbered ones of
:data:`NUMBERED_BUFFERS`."""
NUMBERED_BUFFERS = re.compile(r"conf_ring_\d+")
"""The confidence ring's slots (``conf_ring_0``, ``conf_ring_1``, ...: as deep as configured)."""


def is_protocol_buffer(name: str) -> bool:
    """``name`` is a buffer the protocol allocates in some configuration."""
    return name in PROTOCOL_BUFFERS or NUMBERED_BUFFERS.fullmatch(name) is not None


def check_race_buffers(s: Scenario, out: Problems) -> None:
    """Report each race expectation (``check.races``, ``mutation[i].races``) whose buffer the
    protocol never allocates; entries that already have a problem are skipped."""
    expectations = [("check", s.check.races)]
    expectations += [(f"mutation[{i}]", m.races) for i, m in enumerate(s.mutation)]
    for prefix, races in expectations:
        for i, race in enumerate(races):
            key = f"{prefix}.races[{i}]"
            parts = race.split()
            if len(parts) != 2 or not out.ok(key) or is_protocol_buffer(parts[1]):
                continue
            close = difflib.get_close_matches(parts[1], PROTOCOL_BUFFERS, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            out.add(key, f"unknown buffer {show(parts[1])}; {hint}the protocol's buffers are "
                         f"{'|'.join(PROTOCOL_BUFFERS)}|conf_ring_<N>")
