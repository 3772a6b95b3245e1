"""SGLang's own ``Scheduler``, made with ``Scheduler.__new__`` as SGLang's unit tests make it.

``Scheduler.__init__`` starts a server (ZMQ sockets, tokenizer, model weights, NCCL), so the
object is made bare and given what the overlap loop reads: SGLang's own pools, radix cache,
schedule policy and batch result processor, built by its own ``init_*`` methods where they
need no server, and :class:`~overlap_harness.engines.core.strict.StrictStub` stand-ins for the
server plumbing (output sending, load publishing, profiling). Every stand-in lists the
attributes the loop may touch; anything else raises with its name.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.sglang.stand_ins import checkpoint

DEVICE = "cuda"  # faked on the CPU by the recorder


@dataclass(frozen=True, slots=True)
class PoolSizes:
    """How big SGLang's pools are made: few request rows, so that they are recycled within a
    variant's iterations."""

    request_rows: int = 4
    max_context: int = 64
    kv_tokens: int = 96


def _false(*args: Any, **kwargs: Any) -> bool:
    """A feature the driven variants never use (no grammar waits, no pending work)."""
    return False


def _zero(*args: Any, **kwargs: Any) -> int:
    """A count only metrics read."""
    return 0


def _noop(*args: Any, **kwargs: Any) -> None:
    """Server plumbing whose only effect is outside the process (logs, sockets, metrics)."""


def base_server_options() -> dict[str, Any]:
    """The ``ServerArgs`` keyword arguments of every variant before its features add theirs:
    no checkpoint or tokenizer, one-token pages, no chunked prefill, no radix cache."""
    return {"model_path": "dummy", "page_size": 1, "chunked_prefill_size": None,
            "disable_radix_cache": True, "enable_mixed_chunk": False,
            "skip_tokenizer_init": True}


def server_args(options: dict[str, Any]) -> Any:
    """SGLang's ``ServerArgs`` of ``options`` (keyword arguments), published as the
    scheduler's configuration."""
    from sglang.srt.server_args import ServerArgs

    return publish(ServerArgs(**options))


def dp_attention_arguments(server_args_class: type) -> dict[str, Any]:
    """Tensor parallel 2 with attention data parallel 2, as the release's ``ServerArgs``
    spells it: an ``attn_dp_size`` field, or (older releases) ``enable_dp_attention`` with
    ``dp_size``."""
    fields = inspect.signature(server_args_class).parameters
    if "attn_dp_size" in fields:
        return {"tp_size": 2, "attn_dp_size": 2}
    return {"tp_size": 2, "dp_size": 2, "enable_dp_attention": True}


def publish(args: Any) -> Any:
    """Publish ``args`` as the scheduler's configuration for one variant's run, this process
    rank 0 of every group; returns ``args``."""
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    # what an earlier variant stamped goes first (EAGLE's one-rank groups contradict the
    # tensor parallel 2 a DP variant publishes: SGLang's publish validates the topology)
    parallel = get_parallel()
    if hasattr(parallel, "clear_stamp"):  # releases whose publish validates the topology
        parallel.clear_stamp()
    _PROCESS_OVERRIDES.close()  # an earlier variant's (releases without permanent ones)
    with _previous_run_overrides_dropped_quietly():
        set_global_server_args_for_scheduler(args)
    _single_rank(args)
    return args


class _DroppedOverridesNotice(logging.Filter):
    """Holds back SGLang's warning that a publish dropped the overrides taken since the last
    one: each variant publishes its own configuration, so the previous run's overrides (the
    pools' micro-batch size, the graph runner's config) are meant to go."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "dropped" not in record.getMessage() or "override" not in record.getMessage()


@contextmanager
def _previous_run_overrides_dropped_quietly() -> Iterator[None]:
    """SGLang's publish without its notice of dropped overrides (any other record passes)."""
    logger = logging.getLogger("sglang.srt.runtime_context")
    notice = _DroppedOverridesNotice()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)


def _single_rank(args: Any) -> None:
    """This process's place in every parallel group: rank 0 (no groups are built), forced in
    SGLang's parallel context for the run (:func:`override_for_run`), and the widths the
    configured sizes imply wherever the release's context cannot answer them without live
    groups (SGLang's own ``compute_dp_attention_world_info`` for the attention split). A
    release whose context answers widths from the group build's stamp (0.5.19) is stamped
    with SGLang's own ``derive_parallel_widths``."""
    from sglang.srt import runtime_context
    from sglang.srt.layers.dp_attention import compute_dp_attention_world_info

    parallel = runtime_context.get_parallel()
    if not hasattr(parallel, "override_permanently") and hasattr(parallel,
                                                                  "stamp_derived_widths"):
        parallel.clear_derived_widths()
        parallel.stamp_derived_widths(**runtime_context.derive_parallel_widths(
            tp_size=args.tp_size, attn_cp_size=args.attn_cp_size,
            attn_dp_size=args.dp_size if args.enable_dp_attention else 1,
            moe_ep_size=args.ep_size, moe_dp_size=args.moe_dp_size,
            dcp_size=args.dcp_size, dcp_enabled=False))
    override_for_run(tp_rank=0, attn_tp_rank=0, attn_cp_rank=0, pp_rank=0, moe_ep_rank=0,
                     attn_dp_rank=0, dp_rank=None, world_rank=0, moe_dp_rank=0,
                     moe_tp_rank=0, dcp_rank=0, attn_dcp_rank=0)
    known = _parallel_fields(runtime_context)
    if all(_answers(parallel, name) for name in _WIDTHS if known is None or name in known):
        return
    # the split as releases whose context needs it compute it (their signature)
    _, attn_tp_size, _, attn_dp_size = compute_dp_attention_world_info(
        args.enable_dp_attention, 0, args.tp_size, args.dp_size, args.attn_cp_size)
    widths = {"attn_tp_size": attn_tp_size, "attn_dp_size": attn_dp_size,
              "attn_cp_size": args.attn_cp_size, "tp_size": args.tp_size,
              "pp_size": args.pp_size, "world_size": args.tp_size * args.pp_size,
              "moe_ep_size": args.ep_size, "moe_dp_size": args.moe_dp_size,
              "moe_tp_size": args.tp_size // args.ep_size // args.moe_dp_size,
              "dcp_enabled": False, "dcp_size": 1, "attn_dcp_size": 1}
    unanswered = {name: value for name, value in widths.items()
                  if not _answers(parallel, name)}
    if unanswered:
        override_for_run(**unanswered)


#: the widths a parallel context may answer only from live groups
_WIDTHS = ("attn_tp_size", "attn_dp_size", "attn_cp_size", "tp_size", "pp_size",
           "world_size", "moe_ep_size", "moe_dp_size", "moe_tp_size", "dcp_enabled",
           "dcp_size", "attn_dcp_size")


def _parallel_fields(runtime_context: Any) -> frozenset[str] | None:
    """The fields the release's parallel context knows (a frozenset, or a function giving
    it in later releases); None when the release does not say."""
    fields = getattr(runtime_context, "_PARALLEL_FIELDS", None)
    if fields is None and callable(getattr(runtime_context, "_parallel_fields", None)):
        fields = runtime_context._parallel_fields()
    return frozenset(fields) if fields is not None else None


def _answers(parallel: Any, name: str) -> bool:
    """Whether the parallel context answers ``name`` now (a width read from a live group
    fails without one)."""
    try:
        getattr(parallel, name)
    except (AssertionError, AttributeError, RuntimeError, ValueError):
        return False
    return True


#: the parallel-context overrides held for one variant's run, in releases whose context
#: has only the scoped ``override()``; closed when the next variant publishes
_PROCESS_OVERRIDES = ExitStack()


def hold_for_run(context: Any) -> None:
    """Enter ``context`` until the next variant publishes (beside the parallel-context
    overrides of :func:`override_for_run`)."""
    _PROCESS_OVERRIDES.enter_context(context)


def override_for_run(**values: Any) -> None:
    """Force parallel-context ``values`` (ranks, widths, groups) until the next variant
    publishes: SGLang's ``override_permanently`` where the release has it, and its scoped
    ``override()``, entered here and left at the next :func:`publish`, for what the context
    still does not answer with the value (older releases keep ranks only there). A field
    the release's context does not have is one its code does not read."""
    from sglang.srt import runtime_context

    parallel = runtime_context.get_parallel()
    known = _parallel_fields(runtime_context)
    if hasattr(parallel, "override_permanently"):
        parallel.override_permanently(**{name: value for name, value in values.items()
                                         if known is None or name in known})
    scoped = {name: value for name, value in values.items()
              if (known is None or name in known)
              and (not _answers(parallel, name) or (getattr(parallel, name) is not value
                   and getattr(parallel, name) != value))}
    if scoped:
        _PROCESS_OVERRIDES.enter_context(parallel.override(**scoped))


def build_pools(sizes: PoolSizes, *, radix_cache: bool) -> tuple[Any, Any, Any]:
    """SGLang's ``ReqToTokenPool``, ``TokenToKVPoolAllocator`` and ``RadixCache`` (disabled:
    SGLang's no-prefix-sharing cache) on the (faked) CUDA device."""
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixCache

    req_to_token_pool = ReqToTokenPool(sizes.request_rows, sizes.max_context, DEVICE, False)
    # a plain MHA pool: no DeepSeek-V4 draft states (the EAGLE verify probes for them)
    kv_pool = StrictStub("token_to_kv_pool", absent=("clear_unaccepted_c128_draft_states",))
    allocator = TokenToKVPoolAllocator(sizes.kv_tokens, torch.float16, DEVICE, kv_pool, False)
    params = CacheInitParams(disable=not radix_cache, req_to_token_pool=req_to_token_pool,
                             token_to_kv_pool_allocator=allocator, page_size=1)
    return req_to_token_pool, allocator, RadixCache(params)


def build_scheduler(args: Any, sizes: PoolSizes, *, radix_cache: bool,
                    graph_runner: bool, worker_class: type | None = None,
                    spec_workers: Any = None, pools: Any = None) -> Any:
    """A bare SGLang ``Scheduler`` ready for ``event_loop_overlap`` (inside a recorder watch
    and :func:`~overlap_harness.engines.sglang.environment.cuda_selected`). ``spec_workers``
    (``fn(scheduler, sizes)``) installs a speculative worker before the overlap state that
    depends on it is made (:mod:`.features.eagle`). ``pools`` builds other pools than
    :func:`build_pools`' (``pools.build(sizes, radix_cache=, forward_stream=)`` gives the
    request pool, the token allocator and the tree cache; ``pools.report(scheduler)`` sets
    what SGLang's ``build_kv_cache`` reports of them: :mod:`.features.unified_memory`)."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.utils.common import require_mlp_sync

    from overlap_harness.engines.sglang.stand_ins.model_worker import FakeModelWorker

    # named ``self`` so the recorder names the streams as SGLang's own code names them
    self = constructor_prelude(Scheduler, args)
    self.device = DEVICE
    self.is_initializing = False
    self._sched_idled = False
    self._war_barrier_enabled = True  # run_event_loop's value on CUDA
    self.enable_fpm = False  # forward-pass metrics off (a server option)

    _process_groups(self)
    _ipc_channels(self, args)
    _plumbing(self)
    self.is_generation = True
    self.spec_algorithm = SpeculativeAlgorithm.from_string(None)
    if pools is None:
        self.req_to_token_pool, self.token_to_kv_pool_allocator, self.tree_cache = build_pools(
            sizes, radix_cache=radix_cache)
    else:
        # SGLang's model runner makes its forward stream before the pools that keep it
        self.schedule_stream = torch.cuda.Stream()
        self.forward_stream = torch.cuda.Stream()
        self.req_to_token_pool, self.token_to_kv_pool_allocator, self.tree_cache = pools.build(
            sizes, radix_cache=radix_cache, forward_stream=self.forward_stream)
    self.model_worker = self.tp_worker = (worker_class or FakeModelWorker)(
        self.req_to_token_pool, self.token_to_kv_pool_allocator, sizes.kv_tokens,
        graph_runner=graph_runner)
    self.draft_worker = None
    self.external_corpus_manager = None  # what maybe_init_draft_worker leaves without ngram
    if spec_workers is not None:
        spec_workers(self, sizes)
    self.model_config = checkpoint.model_config(args)
    _worker_info(self, sizes)
    if pools is None:
        self.schedule_stream = torch.cuda.Stream()
        self.forward_stream = torch.cuda.Stream()
    own_init(self, "init_running_status")
    own_init(self, "init_chunked_prefill")
    own_init(self, "init_schedule_policy")
    own_init(self, "init_diffusion_llm")
    own_init(self, "maybe_init_dynamic_chunk_sizer")
    own_init(self, "init_lora_drainer")
    own_init(self, "maybe_init_ngram_embedding")
    own_init(self, "maybe_init_scripted_scheduler_hook")
    self.is_hybrid_swa = self.is_hybrid_ssm = False  # what build_kv_cache reports for the pools
    self.sliding_window_size = self.swa_tokens_per_layer = None
    self.full_tokens_per_layer = sizes.kv_tokens
    if pools is not None:
        pools.report(self)  # what build_kv_cache reports for those pools
    self.kv_shard_widening = 1
    self.disable_radix_cache = not radix_cache
    self.hisparse_coordinator = self.decode_offload_manager = None
    self.enable_overlap_mlx = False
    # as Scheduler.__init__ sets it (older releases pass the server arguments)
    self.require_mlp_sync = (require_mlp_sync(args) if inspect.signature(
        require_mlp_sync).parameters else require_mlp_sync())
    self.weight_updater = StrictStub("weight_updater", offload_tags=set())
    self.truncation_align_size = None  # no DSA or mamba model: what their init methods leave
    # what init_disaggregation leaves without prefill-decode disaggregation (the step itself
    # reads the checkpoint's config for the transfer buffers of the other modes)
    from sglang.srt.disaggregation.utils import DisaggregationMode

    self.disaggregation_mode = DisaggregationMode.NULL
    own_init(self, "init_overlap")
    own_init(self, "init_metrics_collector")
    own_init(self, "init_metrics_reporter")
    own_init(self, "init_pool_stats_observer")
    if hasattr(self.metrics_reporter, "scheduler_stage_metrics"):
        self.scheduler_stage_metrics = self.metrics_reporter.scheduler_stage_metrics
    own_init(self, "init_dp_attn_adapter")
    own_init(self, "init_batch_result_processor")
    own_init(self, "init_invariant_checker")
    own_init(self, "init_load_inquirer")  # the step counters and SGLang's load inquirer
    return self


class _PreludeDone(Exception):
    """Raised by the first boundary step of ``Scheduler.__init__``; carries the scheduler."""

    def __init__(self, scheduler: Any) -> None:
        super().__init__("Scheduler.__init__ stopped at init_model_config")
        self.scheduler = scheduler


def constructor_prelude(scheduler_class: type, args: Any) -> Any:
    """A ``Scheduler`` that ran its own ``__init__`` up to ``init_model_config``, the first
    step that reaches a boundary (the checkpoint's config; then process groups, sockets,
    tokenizer, weights): every release's ``__init__`` starts by parsing its configuration
    into plain fields (its rank arguments into a ``ParallelState`` where it takes them).
    The constructor's parameters are given by name, read from its signature: the server and
    port arguments, and 0 (``dp_rank``: None) for the ranks and GPU id older releases take."""
    from sglang.srt.server_args import PortArgs

    values = {"server_args": args, "port_args": PortArgs.init_new(args), "dp_rank": None,
              "moe_dp_rank": 0, "gpu_id": 0, **dict.fromkeys(
                  ("tp_rank", "moe_ep_rank", "pp_rank", "attn_cp_rank"), 0)}
    arguments = {}
    for name, parameter in inspect.signature(scheduler_class.__init__).parameters.items():
        if name == "self" or parameter.default is not inspect.Parameter.empty:
            continue
        if name not in values:
            raise TypeError(f"Scheduler.__init__ takes {name!r}, which the driver does not "
                            "know how to give (a changed constructor of the release)")
        arguments[name] = values[name]

    def stop(scheduler: Any) -> None:
        raise _PreludeDone(scheduler)

    from overlap_harness.engines.core.patching import attributes_set

    with attributes_set([(scheduler_class, "init_model_config", stop)]):
        try:
            scheduler_class(**arguments)
        except _PreludeDone as done:
            scheduler = done.scheduler
        else:
            raise TypeError("Scheduler.__init__ never called init_model_config (a changed "
                            "constructor of the release)")
    scheduler.port_args = arguments["port_args"]
    return scheduler


def _worker_info(scheduler: Any, sizes: PoolSizes) -> None:
    """What ``TpModelWorker.get_worker_info`` tells the scheduler, for the pools built here."""
    from sglang.srt.runtime_context import get_context, get_parallel

    scheduler.max_total_num_tokens = sizes.kv_tokens
    scheduler.max_prefill_tokens = sizes.kv_tokens
    scheduler.max_running_requests = sizes.request_rows
    scheduler.max_queued_requests = None
    scheduler.max_req_len = sizes.max_context - 1
    scheduler.max_req_input_len = sizes.max_context - 8
    scheduler.random_seed = 0
    scheduler.min_free_slots_delayer = None
    if not get_parallel().pp_max_micro_batch_size:
        get_context().override("scheduler.pp_max_micro_batch_size_default",
                               pp_max_micro_batch_size=sizes.request_rows)


def _plumbing(scheduler: Any) -> None:
    """Strict stand-ins for the server plumbing the loop calls (load reporting, output
    sending, profiling, grammar waits): each lists exactly the calls the driven variants make.
    The metrics reporter is SGLang's own (``init_metrics_reporter``, metrics off)."""
    # idle batches (attention DP) stream their empty output through the generation path
    scheduler.output_streamer = StrictStub("output_streamer", stream_output=_noop,
                                           _stream_output_generation=_noop)
    scheduler.profiler_manager = StrictStub("profiler_manager",
                                            _profile_batch_predicate=_noop)
    scheduler.load_snapshot_writer = None  # SGLang's value with load snapshots off
    scheduler.load_publisher = StrictStub("load_publisher", publish_load_stat=_noop)
    scheduler.kv_events_publisher = StrictStub("kv_events_publisher", publish_kv_events=_noop)
    scheduler.idle_sleeper = None  # SGLang's value without --sleep-on-idle
    scheduler.grammar_manager = StrictStub("grammar_manager", has_waiting_grammars=_false,
                                           grammar_queue=[])


def _ipc_channels(scheduler: Any, args: Any) -> None:
    """The release's own IPC wiring (``init_ipc_channels`` with SGLang's ``PortArgs``) over
    strict sockets (:func:`sockets_faked`): what a release's loop reads of it
    (``ipc_channels``, ``recv_from_tokenizer``) is SGLang's own object."""
    if not hasattr(scheduler, "init_ipc_channels"):
        return
    with sockets_faked():
        scheduler.init_ipc_channels(scheduler.port_args)


@contextmanager
def sockets_faked() -> Iterator[None]:
    """ZMQ socket creation (``get_zmq_socket``, in every loaded SGLang module that imported
    it) answered by a strict socket: sends are dropped (the outputs go to the tokenizer
    process, which is not there), anything else raises with its name."""
    from overlap_harness.engines.core.patching import attributes_set

    changes = [(module, "get_zmq_socket", _strict_socket) for module in _socket_makers()]
    with attributes_set(changes):
        yield


#: the loaded SGLang modules holding ``get_zmq_socket``, and the state of ``sys.modules`` they
#: were found in: its length and its last name (a module imported or removed since changes one)
_makers_found: tuple[int, str, list[Any]] = (-1, "", [])


def _socket_makers() -> list[Any]:
    """Every loaded SGLang module whose namespace holds ``get_zmq_socket``. The scan of
    ``sys.modules`` (6,000 modules; twice per variant run, 3% of a necessity child's CPU) is
    made again only when a module was imported or removed since the last."""
    global _makers_found
    state = (len(sys.modules), next(reversed(sys.modules), ""))
    if state != _makers_found[:2]:
        _makers_found = (*state, [module for name, module in list(sys.modules.items())
                                  if name.startswith("sglang.") and module is not None
                                  and "get_zmq_socket" in vars(module)])
    return [module for module in _makers_found[2] if "get_zmq_socket" in vars(module)]


def _strict_socket(context: Any, socket_type: Any, endpoint: str, bind: bool,
                   *args: Any, **kwargs: Any) -> StrictStub:
    """A socket for ``endpoint`` that takes sends and nothing else."""
    return StrictStub(f"zmq socket {endpoint}", send_pyobj=_noop, send=_noop,
                      send_multipart=_noop)


def own_init(scheduler: Any, name: str) -> None:
    """Call the release's own ``Scheduler.<name>`` as its ``__init__`` does; a release without
    that step (a component it does not have yet) skips it. The rank arguments older releases
    take (``tp_rank``, ``pp_rank``, ``dp_rank``) are this rank's: 0, 0 and None."""
    method = getattr(scheduler, name, None)
    if method is None:
        return
    arguments = {}
    for parameter in inspect.signature(method).parameters.values():
        if parameter.default is not inspect.Parameter.empty:
            continue
        if parameter.name not in _RANK_ARGUMENTS:
            raise TypeError(f"Scheduler.{name} takes {parameter.name!r}, which the driver "
                            "does not know how to give (a changed init step of the release)")
        arguments[parameter.name] = _RANK_ARGUMENTS[parameter.name]
    method(**arguments)


#: the rank arguments some releases' init steps take, for rank 0 of every group
_RANK_ARGUMENTS: dict[str, int | None] = {"tp_rank": 0, "pp_rank": 0, "dp_rank": None,
                                          "moe_ep_rank": 0, "attn_cp_rank": 0}


#: the process groups a release's ``init_model_worker`` keeps on the scheduler (from SGLang's
#: ``get_tp_group()`` and friends), and the CPU groups taken from them
_GROUPS = ("tp_group", "attn_tp_group", "attn_cp_group", "pp_group", "world_group",
           "dp_tp_group")


def _process_groups(scheduler: Any) -> None:
    """Where the release keeps its process groups on the scheduler (its scheduler module
    imports SGLang's ``get_tp_group``: a release feature; later releases read them from
    ``runtime_context.get_parallel()``), one-rank strict groups: this process is rank 0 of
    each, and no collective runs on them."""
    if not hasattr(sys.modules[type(scheduler).__module__], "get_tp_group"):
        return
    for name in _GROUPS:
        cpu_group = StrictStub(name.replace("_group", "_cpu_group"))
        setattr(scheduler, name, StrictStub(name, cpu_group=cpu_group, world_size=1,
                                            rank_in_group=0, rank=0, is_first_rank=True,
                                            is_last_rank=True))
        setattr(scheduler, name.replace("_group", "_cpu_group"), cpu_group)
