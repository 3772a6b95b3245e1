"""The model's protocol keys where the loaded SGLang release differs from the model scenarios.

The loop report's model scenarios (``conformance/model_scenarios/sglang_loop_*.toml``) hold
SGLang 0.5.23's protocol keys. An older release may lack a mechanism one of those keys turns
on; the model then follows the release: the key is turned off for that release's report.
Each difference is found by feature (an SGLang name the release defines or not, as
:mod:`.release_features` looks them up), never by version string, and is written into the
report (``model_protocol``), so that the model column can be computed again without SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from overlap_harness.engines.sglang.release_features import SCHEDULER, Feature, lacks


@dataclass(frozen=True, slots=True)
class ReleaseKey:
    """A model protocol key that stands for an SGLang ``feature``: ``without`` is its value
    for a release that lacks the feature."""

    key: str
    feature: Feature
    without: Any


RELEASE_KEYS: tuple[ReleaseKey, ...] = (
    # 0.5.22 on: update_running_batch leaves out of the decode batch the requests whose
    # queued result gives them their last token (scheduler.py _reqs_finishing_inflight);
    # before, they run one decode more and their rows are freed while it may still read them
    ReleaseKey("skip_finishing_decode",
               Feature("the decode batch leaving out requests its queued result finishes",
                       SCHEDULER, "Scheduler._reqs_finishing_inflight"),
               False),
)


def release_protocol() -> dict[str, Any]:
    """The keys the loaded release needs changed in the model scenarios (empty: none), each
    because the release lacks the feature the key stands for."""
    return {entry.key: entry.without for entry in RELEASE_KEYS
            if lacks(entry.feature) is not None}


def described(protocol: dict[str, Any]) -> list[str]:
    """One line per changed key: the key, its value, and the feature the release lacks."""
    features = {entry.key: entry.feature for entry in RELEASE_KEYS}
    return [f"`{key} = {str(value).lower()}`: the release lacks "
            f"{features[key].what} ({features[key].where()})" if key in features
            else f"`{key} = {value}`" for key, value in protocol.items()]
