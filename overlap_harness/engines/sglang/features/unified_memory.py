"""SGLang's unified memory pool (``--enable-unified-memory``) under the overlap loop.

With the option on, a hybrid sliding-window-attention model keeps its full-attention KV and
its SWA KV in one byte buffer that the two sub-pools share from its two ends (SGLang's
``UnifiedKVPool``); the pages are named by virtual ids, translated to physical pages by a
table the allocator keeps (``MultiEndedAllocator``, one per sub-pool, composed by
``UnifiedSWATokenToKVPoolAllocator``). Freed pages leave holes that lazy compaction closes
later by moving live pages (``_flush``): urgently, when an allocation finds no room at the
frontier, on the schedule stream while the previous batch's forward may still read and write
the pages it moves. That is why ``Scheduler.run_batch`` records a ``forward_done`` event on
the forward stream after each forward and hands it to the allocator
(``set_latest_forward_done_event``, ``set_inflight_forward``): ``_flush`` waits on it before
it moves pages, and gates the reuse of a moved page's source on it.

What runs as SGLang's: the pool, the allocator and its compaction (built by SGLang's own
``init_unified_swa_pools``), the request pool, the ``UnifiedRadixCache`` with its full and SWA
components (SGLang's own sliding-window eviction frees the SWA pages a request no longer
reads), the scheduler and its loop. What the harness gives: the model's geometry (two layers,
one full and one SWA, KV rows of 16 bytes), and the forward
(:class:`~overlap_harness.engines.sglang.stand_ins.unified_memory_worker.UnifiedMemoryWorker`):
it translates the batch's virtual ids with SGLang's own translation and reads and writes the
page envelopes of the shared buffer those ids name. Both files are plumbing to the recorder
(``not_user_code``): the forward's op is reported at SGLang's line that called the worker.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features import eager_prefill
from overlap_harness.engines.sglang.features.api import Feature
from overlap_harness.engines.sglang.scheduler_build import DEVICE, PoolSizes
from overlap_harness.engines.sglang.stand_ins import unified_memory_kernels
from overlap_harness.engines.sglang.stand_ins.unified_memory_worker import (
    UnifiedMemoryWorker,
    _prefill_reads_end,
)
from overlap_harness.recorder.sites import not_user_code

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant

not_user_code(__file__)  # a race names SGLang's line that called in here, not this file's


@dataclass(frozen=True, slots=True)
class UnifiedMemory(Feature):
    """``--enable-unified-memory``: a hybrid-SWA model's full and SWA KV in SGLang's unified
    pool, lazily compacted behind the ``forward_done`` event ``run_batch`` records. Its
    configuration is the model the pool is built for: its sliding window, and the shared
    buffer's size in page envelopes of one token (each sub-pool's envelope is one layer's K
    and V rows: 32 bytes), the budget SGLang's profiler hands the pool
    (``unified_total_bytes``: neither sub-pool is capped by a static share)."""

    keys: ClassVar[tuple[str, ...]] = ("unified_memory", "attention_reads_end")
    options: ClassVar[tuple[str, ...]] = ("--enable-unified-memory",
                                          "SGLANG_SWA_EVICTION_INTERVAL",
                                          "SGLANG_ENABLE_PREFILL_WAR_READ_DONE")
    fake_runner: ClassVar[bool] = False

    sliding_window: int = 4
    buffer_pages: int = 30
    # SGLANG_SWA_EVICTION_INTERVAL: a decoding request's SWA pages are freed once this many
    # tokens slid out of the window (SGLang's default, 128, is past the variant's sequences)
    eviction_interval: int = 2
    # the attention backend declares a prefill's shared reads ended in its metadata init
    # (SharedReadEnds.PRE_REPLAY, as TRT-LLM MHA, a backend unified memory allows): SGLang's
    # maybe_publish_prefill_shared_read_done then publishes the read-done event the WAR
    # barrier waits on instead of the whole forward, before the KV reads and writes
    prefill_reads_end_pre_replay: bool = False

    def configuration(self, variant: Variant) -> dict[str, str]:
        config = {"unified_memory": "on"}
        if self.prefill_reads_end_pre_replay:
            config["attention_reads_end"] = "pre_replay"
        return config

    def release_needs(self, variant: Variant) -> list[ReleaseFeature]:
        return [rf.UNIFIED_MEMORY, rf.UNIFIED_SWA_POOLS, rf.UNIFIED_PAGE_COPY] + (
            [rf.EAGER_PREFILL_READ_DONE] if self.prefill_reads_end_pre_replay else [])

    def kernels(self, variant: Variant) -> tuple[Callable[[], None], ...]:
        return (unified_memory_kernels.declare,)

    def server_options(self, options: dict[str, Any], variant: Variant) -> None:
        options["enable_unified_memory"] = True

    def switches(self, variant: Variant) -> AbstractContextManager[Any]:
        return _switches(self)

    def worker_class(self, variant: Variant) -> type | None:
        return UnifiedMemoryWorker

    def pools(self, variant: Variant) -> Any:
        return UnifiedPools(self)

    def attach(self, scheduler: Any, server_args: Any, variant: Variant) -> None:
        attach(scheduler, self)

    def total_bytes(self) -> int:
        """The shared buffer's bytes."""
        return self.buffer_pages * 2 * HEAD_DIM * torch.finfo(torch.float16).bits // 8


#: layer 0 is the SWA layer, layer 1 the full-attention layer
SWA_LAYER, FULL_LAYER = 0, 1


HEAD_DIM = 8  # float16: 16-byte K and V rows, the unified pool's alignment


class UnifiedPools:
    """``pools`` for :func:`~.scheduler_build.build_scheduler`: SGLang's unified SWA pools."""

    def __init__(self, config: UnifiedMemory) -> None:
        self.config = config
        self.bundle: Any = None

    def build(self, sizes: PoolSizes, *, radix_cache: bool,
              forward_stream: Any) -> tuple[Any, Any, Any]:
        """SGLang's ``ReqToTokenPool``, its unified SWA pools (``init_unified_swa_pools``, lazy
        compaction on, as ``_should_enable_lazy_compaction`` defaults) and a
        ``UnifiedRadixCache`` with a full and an SWA component."""
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_memory_pool import init_unified_swa_pools
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        config = self.config
        req_to_token_pool = ReqToTokenPool(sizes.request_rows, sizes.max_context, DEVICE, False)
        # the profiled budget, under the name the release's factory takes it by
        budget = ("total_bytes" if "total_bytes" in inspect.signature(
            init_unified_swa_pools).parameters else "unified_total_bytes")
        self.bundle = init_unified_swa_pools(
            device=DEVICE, kv_cache_dtype=torch.float16, head_num=1, head_dim=HEAD_DIM,
            v_head_dim=HEAD_DIM, swa_head_num=1, swa_head_dim=HEAD_DIM,
            swa_v_head_dim=HEAD_DIM, page_size=1, start_layer=0, end_layer=2,
            swa_attention_layer_ids=[SWA_LAYER], full_attention_layer_ids=[FULL_LAYER],
            enable_memory_saver=False, **{budget: config.total_bytes()},
            need_sort=False, forward_stream=forward_stream, lazy_compaction=True,
            model_context_len=sizes.max_context, sliding_window_size=config.sliding_window)
        allocator = self.bundle.token_to_kv_pool_allocator
        params = CacheInitParams(disable=not radix_cache, req_to_token_pool=req_to_token_pool,
                                 token_to_kv_pool_allocator=allocator, page_size=1,
                                 sliding_window_size=config.sliding_window,
                                 tree_components=(ComponentType.FULL, ComponentType.SWA))
        return req_to_token_pool, allocator, UnifiedRadixCache(params)

    def report(self, scheduler: Any) -> None:
        """What ``build_kv_cache`` reports for a hybrid-SWA model's pools."""
        allocator = self.bundle.token_to_kv_pool_allocator
        scheduler.is_hybrid_swa = True
        scheduler.sliding_window_size = self.config.sliding_window
        scheduler.full_tokens_per_layer = allocator.size_full
        scheduler.swa_tokens_per_layer = allocator.size_swa


@contextmanager
def _switches(config: UnifiedMemory) -> Iterator[None]:
    """SGLang's switch of the prefill read-done fastpath (``SGLANG_ENABLE_PREFILL_WAR_READ_DONE``,
    on by default in 0.5.23, opt-in in 0.5.22), set on when the prefills publish their
    read-done event early, and the eviction interval."""
    with (eager_prefill.fastpath_enabled(config.prefill_reads_end_pre_replay),
          eviction_selected(config)):
        yield


@contextmanager
def eviction_selected(config: UnifiedMemory) -> Iterator[None]:
    """``SGLANG_SWA_EVICTION_INTERVAL`` set to the variant's for the block."""
    from sglang.srt.environ import envs

    with envs.SGLANG_SWA_EVICTION_INTERVAL.override(config.eviction_interval):
        yield


def attach(scheduler: Any, config: UnifiedMemory) -> None:
    """The model's sliding window, given to the forward that reads it."""
    scheduler.tp_worker.window = config.sliding_window
    scheduler.tp_worker.prefill_reads_end_pre_replay = config.prefill_reads_end_pre_replay
    runner = scheduler.tp_worker.model_runner
    runner.spec_algorithm = scheduler.spec_algorithm
    if config.prefill_reads_end_pre_replay:
        runner.attn_backend = StrictStub("attn_backend", needs_cpu_seq_lens=True,
                                         shared_read_ends=_prefill_reads_end,
                                         absent=("extend_attention_block_m",))
