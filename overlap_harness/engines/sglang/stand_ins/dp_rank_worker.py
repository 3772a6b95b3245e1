"""The fake worker of an attention-DP rank (the feature: :mod:`..features.dp_attention`):
CUDA-graph replay of decode and idle batches when every rank voted for it, the read-done
event published after each replay, as SGLang's decode graph runner publishes it."""

from __future__ import annotations

from typing import Any

import torch

from overlap_harness.engines.sglang.stand_ins.model_worker import FakeModelWorker


class DPRankModelWorker(FakeModelWorker):
    """The fake worker of an attention-DP rank: CUDA-graph replay of decode and idle batches
    when every rank voted for it (module docstring); the read-done event published after
    each replay, as SGLang's decode graph runner publishes it."""

    def __init__(self, req_to_token_pool: Any, allocator: Any, kv_tokens: int, *,
                 graph_runner: bool) -> None:
        super().__init__(req_to_token_pool, allocator, kv_tokens, graph_runner=False)
        self.captures_decode_graphs = graph_runner
        # what the DP sync reads of the target runner: no speculative algorithm
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.model_runner.spec_algorithm = SpeculativeAlgorithm.from_string(None)
        self.launched: list[tuple[str, int, bool]] = []  # (mode, requests, graph replay)

    def forward_batch_generation(self, batch: Any, **kwargs: Any) -> Any:
        """The base worker's forward (an idle batch's is empty), then what the graph runner
        publishes when the gathered vote let it replay."""
        mode = batch.forward_mode
        replays = (self.captures_decode_graphs and mode.is_decode_or_idle()
                   and bool(_graph_vote(batch)))
        result = super().forward_batch_generation(batch, **kwargs)
        if replays:
            event = torch.cuda.Event()
            event.record()
            self.model_runner.shared_read_done_event = event
        self.launched.append((mode.name, batch.batch_size(), replays))
        result.can_run_cuda_graph = replays
        return result


def _graph_vote(batch: Any) -> Any:
    """The gathered vote for a decode-graph replay, under the name the release's
    ``ScheduleBatch`` gives it (``can_run_decode_cuda_graph``; 0.5.17:
    ``can_run_dp_cuda_graph``)."""
    for name in ("can_run_decode_cuda_graph", "can_run_dp_cuda_graph"):
        if hasattr(batch, name):
            return getattr(batch, name)
    raise AttributeError("ScheduleBatch has neither can_run_decode_cuda_graph nor "
                         "can_run_dp_cuda_graph (the DP ranks' gathered graph vote)")
