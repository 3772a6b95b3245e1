"""The default suite, one entry per scenario file: (folder, name, fields).

Folders: ``protocol/`` follows PROTOCOL.md §9 (file names carry the § number), ``variants/``
covers every protocol variant and workload shape, ``syncs/`` removes each sync label.
"""

from __future__ import annotations

REF = {"mode": "spec_v2", "debug_poison": True}
NB = {**REF, "war_barrier": "none"}


def rm(*labels: str, races: list[str] | None = None, expect: str = "race", **kw) -> dict:
    m = {"remove": list(labels), "expect": expect}
    if races:
        m["races"] = races
    m.update(kw)
    return m


def st(expect: str = "race", races: list[str] | None = None, name: str | None = None,
       **overrides) -> dict:
    m: dict = {"set": overrides, "expect": expect}
    if name:
        m["name"] = name
    if races:
        m["races"] = races
    return m


SUITE = [
    # -- PROTOCOL.md §9 ---------------------------------------------------------------------
    ("protocol", "s01_stash_gather_fifo", dict(
        desc="§9.1: stash(n) precedes gather(n+1) in F's FIFO; a stash moved to a side stream "
             "with no event races the next gather",
        protocol=REF, workload="steady",
        mutations=[st("race_free", name="side_stream_with_event", stash_stream="side"),
                   {"name": "side_stream_no_event", "set": {"stash_stream": "side"},
                    "remove": ["stash.fifo"], "expect": "race",
                    "races": ["RAW output_tokens_buf"]}])),
    ("protocol", "s02_schedule_waits_publish", dict(
        desc="§9.2: with no WAR barrier, S's seq_lens gather is ordered after verify only by "
             "its wait on publish_ready",
        protocol=NB, workload="steady",
        mutations=[rm("publish_ready.schedule_wait", races=["RAW new_seq_lens_buf"])])),
    ("protocol", "s03_d2h_waits_publish", dict(
        desc="§9.3: the D2H stream waits on publish_ready before copying new_seq_lens_buf; "
             "without it seq_lens_cpu is stale while the GPU value is right",
        protocol=REF, workload="steady",
        mutations=[rm("publish_ready.d2h_wait", races=["RAW new_seq_lens_buf"])])),
    ("protocol", "s04_host_reads_pinned_early", dict(
        desc="§9.4: the host synchronizes D before reading the pinned mirror; skipping it "
             "reads old or partial values",
        protocol=REF, workload="steady",
        mutations=[rm("d2h.host_sync", races=["host-D2H new_seq_lens_cpu_pinned"])])),
    ("protocol", "s05_publish_placement", dict(
        desc="§9.5: recording publish_ready after draft-extend keeps values right but "
             "releases the host later (occupancy only; see whatif)",
        protocol=REF, workload="steady",
        mutations=[st("race_free", name="publish_after_draft_extend",
                      publish_point="after_draft_extend")])),
    ("protocol", "s06_d2h_on_schedule_stream", dict(
        desc="§9.6: a blocking .cpu() of seq_lens on S under the loop-top barrier: values "
             "right, host stalls until forward n-1 ends (see whatif)",
        protocol={**REF, "seq_lens_d2h": "schedule_stream"}, workload="steady",
        mutations=[st("race_free", name="private_d2h_stream", seq_lens_d2h="d2h_stream")])),
    ("protocol", "s07_swa_mapping_war", dict(
        desc="§9.7: SWA eviction on S clears mapping entries forward n-1 still translates; the "
             "loop-top barrier orders it",
        protocol={**REF, "swa": True}, workload="evict",
        mutations=[rm("war_barrier", races=["WAR full_to_swa_index_mapping"])])),
    ("protocol", "s08_recycled_req_to_token_row", dict(
        desc="§9.8: A finishes in n-1 while still scheduled; its row goes to new request C; "
             "C's req_to_token writes must come after forward n-1",
        protocol=REF, workload="recycle",
        mutations=[rm("war_barrier", races=["WAR req_to_token"])])),
    ("protocol", "s09_result_processing_war", dict(
        desc="§9.9 (#31687): result processing of n-1 clears SWA entries on S after forward n "
             "is launched; REF's loop-top barrier does not cover it, after_launch does",
        protocol={**REF, "swa": True}, workload="recycle", expect="race",
        races=["WAR full_to_swa_index_mapping"],
        mutations=[st("race_free", name="barrier_after_launch", war_barrier="after_launch")])),
    ("protocol", "s09b_after_launch_barrier", dict(
        desc="§9.9: the barrier right after each launch (#31687) makes SWA result processing "
             "race-free; removing it brings the race back",
        protocol={**REF, "swa": True, "war_barrier": "after_launch"}, workload="recycle",
        mutations=[rm("war_barrier", races=["WAR full_to_swa_index_mapping"])])),
    ("protocol", "s10_forward_entry_raw", dict(
        desc="§9.10: prepare_for_decode writes req_to_token[row, cur:nxt] on S; F waits on S "
             "before draft and verify read them",
        protocol=REF, workload="steady",
        mutations=[rm("forward_entry", races=["RAW req_to_token"])])),
    ("protocol", "s11_overallocation_lag", dict(
        desc="§9.11: 1x over-allocation does not cover seq_len + N (the host lags one verify): "
             "a debug check fires with no stream bug involved",
        protocol={**REF, "alloc_factor": 1}, workload="solo", expect="fault",
        mutations=[st("race_free", name="two_x_allocation", alloc_factor=2)])),
    ("protocol", "s14_index_tensor_lifetime", dict(
        desc="§9.14 (#18958): future_indices allocated on S and read on F is kept alive by "
             "record_stream and the pin ring; without both the allocator reuses it",
        protocol=NB, workload="steady",
        mutations=[rm("future_indices.record_stream", "batch_pin_ring",
                      races=["reuse future_indices"])])),
    ("protocol", "s15_pin_ring_depth", dict(
        desc="§9.15: snapshot tensors pinned for fewer than 2 iterations are freed mid-read",
        protocol=NB, workload="steady",
        mutations=[st(name="ring_depth_0", pin_ring_depth=0)])),
    ("protocol", "s16_mix_running_indices_lifetime", dict(
        desc="§9.16 (#34076): a mixed chunk's mix_running_indices, built on S, must stay alive "
             "until F's gather; without the keep-alive the allocator reuses it",
        protocol={"mode": "non_spec", "war_barrier": "none"}, workload="mixed_chunk",
        mutations=[rm("mix_running_indices.keep_alive", races=["reuse mix_running_indices"])])),
    ("protocol", "s17_wwrr_double_stash", dict(
        desc="§9.17 (#26108): two stashes to one row, then two gathers: the -1 poison assert "
             "fires on the second gather; without poison the first value is silently lost",
        protocol=REF, workload="double_stash", expect="fault",
        mutations=[st("race_free", name="no_poison_silent_loss", debug_poison=False)])),
    ("protocol", "s18_gather_before_any_stash", dict(
        desc="§9.18: a missing seed: the gather reads a never-stashed row; the CI assert fires, "
             "production reads garbage",
        protocol=REF, workload="skip_seed", expect="fault",
        mutations=[st("race_free", name="no_poison_reads_garbage", debug_poison=False)])),
    ("protocol", "s19_chunked_prefill_rows", dict(
        desc="§9.19: chunked prefill re-stashes one row per chunk; with row slots only the "
             "last value is read",
        protocol=REF, workload="chunked",
        mutations=[st("fault", name="old_ring_layout", future_layout="ring", ring_size=3)])),
    ("protocol", "s21_merge_prefill_skip_publish", dict(
        desc="§9.21: prefill [C, D] merged into running [A, B]; C's publish is skipped, so its "
             "seq_lens are stale; the #30471 poison of new_seq_lens_buf catches it",
        protocol=REF, workload="merge_skip_publish", expect="fault",
        mutations=[st("race_free", name="no_poison_stale_seq_lens", debug_poison=False)])),
    ("protocol", "s23_non_cuda_path", dict(
        desc="§9.23: HIP: no D2H stream, the host waits on publish_ready then .cpu(); "
             "skipping the host wait reads a stale length",
        protocol={**REF, "platform": "hip", "seq_lens_d2h": "schedule_stream"},
        workload="steady",
        mutations=[rm("publish_ready.host_wait", races=["RAW new_seq_lens_buf"])])),
    ("protocol", "s23b_hip_swa_without_barrier", dict(
        desc="§9.23: with no barrier on HIP, S's SWA writes race forward n-1 as in §9.7; "
             "forcing the barrier (#27967) orders them",
        protocol={**REF, "platform": "hip", "seq_lens_d2h": "schedule_stream", "swa": True},
        workload="evict", expect="race", races=["WAR full_to_swa_index_mapping"],
        mutations=[st("race_free", name="forced_barrier", force_barrier=True)])),
    ("protocol", "s24_delayed_sampling", dict(
        desc="§9.24: non-spec grammar: the stash of n is enqueued after F waits on S, before "
             "the gather of n+1; enqueued after that gather it reads an unsampled value",
        protocol={"mode": "non_spec", "delayed_sampling": True, "debug_poison": True},
        workload="steady",
        mutations=[st("fault", name="stash_after_gather", delayed_stash_after_gather=True),
                   rm("delayed_sampling.forward_wait", races=["RAW grammar_mask"])])),
    ("protocol", "s25_topk1_chain_steps_1", dict(
        desc="§9.25: the topk=1 fast path with one draft step (empty parent list)",
        protocol={**REF, "num_steps": 1, "num_draft_tokens": 2}, workload="steady",
        mutations=[rm("forward_entry", races=["RAW req_to_token"])])),
    ("protocol", "s25_topk1_chain_steps_4", dict(
        desc="§9.25: the topk=1 fast path with four draft steps",
        protocol={**REF, "num_steps": 4, "num_draft_tokens": 5}, workload="steady",
        mutations=[rm("publish_ready.d2h_wait", races=["RAW new_seq_lens_buf"])])),
    ("protocol", "s26_stream_aliasing", dict(
        desc="§9.26 (#31681): S and F the same stream would hide every race; the harness "
             "refuses to run it",
        protocol={**REF, "alias_schedule_forward": True}, workload="steady", expect="error",
        mutations=[st("race_free", name="distinct_streams", alias_schedule_forward=False)])),
    # -- variants -----------------------------------------------------------------------------
    ("variants", "legacy_verify_done", dict(
        desc="Before #25879: S waits on verify_done in filter/merge/prepare_for_decode",
        protocol={**NB, "seq_lens_sync": "verify_done"}, workload="steady",
        mutations=[rm("verify_done.schedule_wait", races=["RAW new_seq_lens_buf"])])),
    ("variants", "non_spec_decode", dict(
        desc="Non-spec mode: only output_tokens_buf is relayed; S builds a new seq_lens "
             "tensor each iteration",
        protocol={"mode": "non_spec", "debug_poison": True}, workload="steady",
        mutations=[rm("forward_entry", races=["RAW req_to_token"]),
                   rm("copy_done.host_sync", races=["host-D2H next_tokens_cpu"])])),
    ("variants", "non_spec_recycled_row", dict(
        desc="Non-spec mode with a recycled request-pool row",
        protocol={"mode": "non_spec"}, workload="recycle",
        mutations=[rm("war_barrier", races=["WAR req_to_token"])])),
    ("variants", "copy_done_host_sync", dict(
        desc="The host waits copy_done(n-1) before processing results",
        protocol=REF, workload="steady",
        mutations=[rm("copy_done.host_sync", races=["host-D2H next_tokens_cpu"])])),
    ("variants", "plan_stream", dict(
        desc="SGLANG_ENABLE_OVERLAP_PLAN_STREAM: metadata prepared on PL, F waits on PL",
        protocol={**REF, "plan_stream": True}, workload="steady",
        mutations=[rm("plan.forward_wait", races=["RAW plan_metadata"]),
                   rm("plan.schedule_wait", races=["RAW seq_lens"])])),
    ("variants", "read_done_barrier", dict(
        desc="#28363: S waits on the runner's one-shot read_done event instead of all of F",
        protocol={**REF, "war_barrier": "read_done"}, workload="recycle",
        mutations=[rm("war_barrier", races=["WAR req_to_token"])])),
    ("variants", "after_replay_prepare_barrier", dict(
        desc="A read_done event recorded right after replay_prepare's metadata reads (the "
             "out_cache_loc copies from req_to_token), before verify: verify's attention "
             "still reads req_to_token, so a recycled row's prefill_alloc races it; recorded "
             "after verify (#28363) it does not",
        protocol={**REF, "war_barrier": "after_replay_prepare"}, workload="recycle",
        expect="race", races=["WAR req_to_token"],
        mutations=[st("race_free", name="read_done_after_verify", war_barrier="read_done"),
                   st("race_free", name="non_spec_waits_all_of_forward", mode="non_spec")])),
    ("variants", "dp_idle_rank", dict(
        desc="DP idle iterations: publish and stash return early, no publish_ready record",
        protocol=NB, workload="idle",
        mutations=[rm("publish_ready.schedule_wait", races=["RAW new_seq_lens_buf"])])),
    ("variants", "retract_and_chunked", dict(
        desc="Retract from the back, re-admission, chunked prefill and an idle iteration",
        protocol=REF, workload="mixed",
        mutations=[rm("forward_entry", races=["RAW req_to_token"])])),
    ("variants", "chunked_prefill_no_barrier", dict(
        desc="Chunked prefill with no WAR barrier: the S gather still waits on publish_ready",
        protocol=NB, workload="chunked",
        mutations=[rm("publish_ready.schedule_wait", races=["RAW new_seq_lens_buf"])])),
    ("variants", "bootstrap", dict(
        desc="First iterations: publish_ready never recorded, resolve uses a blocking .cpu()",
        protocol=REF, workload="bootstrap",
        mutations=[rm("forward_entry", races=["RAW req_to_token"])])),
    ("variants", "topk2_tree", dict(
        desc="topk=2 draft tree through organize_draft_results (slow path)",
        protocol={**REF, "topk": 2, "num_steps": 3, "num_draft_tokens": 6}, workload="steady",
        mutations=[rm("publish_ready.d2h_wait", races=["RAW new_seq_lens_buf"])])),
    ("variants", "no_hidden_states", dict(
        desc="STANDALONE / multi-layer EAGLE: hidden states not relayed",
        protocol={**REF, "hidden_states": False}, workload="steady",
        mutations=[{"name": "side_stream_no_event", "set": {"stash_stream": "side"},
                    "remove": ["stash.fifo"], "expect": "race",
                    "races": ["RAW output_tokens_buf"]}])),
    ("variants", "unfused_gather", dict(
        desc="The 4-gather reference instead of the fused spec-extras gather",
        protocol={**REF, "gather": "unfused"}, workload="steady",
        mutations=[rm("forward_entry", races=["RAW future_indices"])])),
    ("variants", "seq_lens_opt_out", dict(
        desc="Backend opts out of seq_lens_cpu (#26128): no D2H at all",
        protocol={**NB, "seq_lens_d2h": "none"}, workload="steady",
        mutations=[rm("publish_ready.schedule_wait", races=["RAW new_seq_lens_buf"])])),
    ("variants", "schedule_stream_cpu_sync", dict(
        desc="Blocking .cpu() of seq_lens on S: removing its host wait reads pinned memory "
             "before the copy lands",
        protocol={**REF, "seq_lens_d2h": "schedule_stream"}, workload="steady",
        mutations=[rm("seq_lens.cpu_sync", races=["host-D2H seq_lens_cpu"])])),
    ("variants", "jittered_timing", dict(
        desc="REF under +-30% seeded jitter of every duration: still race-free",
        protocol=REF, workload="steady", timing={"jitter": 0.3}, check={"seed": 7},
        mutations=[rm("d2h.host_sync", races=["host-D2H new_seq_lens_cpu_pinned"])])),
    ("variants", "long_run_16_iterations", dict(
        desc="16 iterations, 5 requests arriving and finishing, rows recycled",
        protocol=REF, workload="long",
        mutations=[rm("war_barrier", races=["WAR req_to_token"])])),
    ("variants", "hip_forced_barrier", dict(
        desc="#27967: the barrier forced on a non-CUDA platform",
        protocol={**REF, "platform": "hip", "seq_lens_d2h": "schedule_stream",
                  "force_barrier": True}, workload="recycle",
        mutations=[rm("war_barrier", races=["WAR req_to_token"])])),
    ("variants", "slow_host", dict(
        desc="A slow host (scheduling costs more than the forward): the forward idles but "
             "stays race-free",
        protocol=REF, workload="steady", timing={"schedule_prep": 3000.0, "host_launch": 20.0},
        mutations=[rm("publish_ready.d2h_wait", races=["RAW new_seq_lens_buf"])])),
    ("variants", "finish_late", dict(
        desc="A request found finished late stays in batch n and is skipped in result "
             "processing; with SWA its release races the in-flight forward (#31687)",
        protocol=REF, workload="finish_late",
        mutations=[st(name="with_swa", races=["WAR full_to_swa_index_mapping"], swa=True)])),
    ("variants", "after_launch_recycle", dict(
        desc="#31687's barrier placement on the recycled-row workload",
        protocol={**REF, "war_barrier": "after_launch"}, workload="recycle",
        mutations=[rm("war_barrier", races=["WAR req_to_token"])])),
    # -- SGLang 0.5.23 mechanisms (docs/protocol-model-notes.md, "SGLang 0.5.23") -----------
    ("variants", "v0523_confidence_relay", dict(
        desc="0.5.23 DSpark confidence relay: D waits publish_ready before copying "
             "confidence_buf into the pinned ring; the planner reads a slot only if its "
             "copy_done answers query() with done",
        protocol={**REF, "confidence_relay": True}, workload="steady",
        mutations=[rm("confidence.d2h_wait", races=["RAW confidence_buf"]),
                   rm("confidence.copy_done_query", expect="race_free")])),
    ("variants", "v0523_mixed_spec_tails", dict(
        desc="0.5.23 resolve_mixed_spec_tails: the tails' CPU lengths come from D, which "
             "waits publish_ready before copying new_seq_lens_buf (backend opted out of "
             "seq_lens_cpu, so this is D's only copy); F's own wait is redundant (F FIFO); "
             "with CI poison S's invalidate races D's copy",
        protocol={**REF, "mixed_spec_tails": True, "seq_lens_d2h": "none",
                  "debug_poison": False}, workload="steady",
        mutations=[rm("mixed_tails.d2h_wait", races=["RAW new_seq_lens_buf"]),
                   rm("mixed_tails.forward_wait", expect="race_free"),
                   st(name="with_ci_poison", races=["RAW new_seq_lens_buf"],
                      debug_poison=True)])),
    ("variants", "v0523_hip_publish_ready_synchronize", dict(
        desc="0.5.23 HIP: resolve_seq_lens_cpu and resolve_mixed_spec_tails call "
             "publish_ready.synchronize() on the host; the resolve's is what orders S's "
             "gather after F's publish",
        protocol={**REF, "platform": "hip", "seq_lens_d2h": "schedule_stream",
                  "mixed_spec_tails": True}, workload="steady",
        mutations=[rm("publish_ready.host_wait", races=["RAW new_seq_lens_buf"]),
                   rm("mixed_tails.host_wait", expect="race_free")])),
    ("variants", "v0523_stream_ordered_resolve", dict(
        desc="0.5.23 resolve_seq_lens_cpu(stream_ordered=True) on HIP with the backend opted "
             "out: the gather runs on F after forward_entry; issued on S instead it races "
             "F's publish",
        protocol={**REF, "platform": "hip", "seq_lens_d2h": "none",
                  "stream_ordered_resolve": True}, workload="steady",
        mutations=[rm("resolve.stream_order", races=["RAW new_seq_lens_buf"])])),
    ("variants", "v0523_adopted_relay", dict(
        desc="0.5.23 relay buffers adopted from a static verify graph: the graph's replay "
             "writes new_seq_lens_buf and publish only records publish_ready, which still "
             "orders S's gather",
        protocol={**NB, "adopted_relay": True}, workload="steady",
        mutations=[rm("publish_ready.schedule_wait", races=["RAW new_seq_lens_buf"])])),
    ("variants", "v0523_consume_once_assert", dict(
        desc="0.5.23 consume-once debug assert: each event-waiting resolve follows a fresh "
             "publish; it checks that a publish was issued, not that it finished, so a "
             "dropped wait races silently",
        protocol={**NB, "consume_once": True}, workload="steady",
        mutations=[rm("publish_ready.schedule_wait", races=["RAW new_seq_lens_buf"])])),
]
