"""The SGLang adapter: SGLang's own ``Scheduler.event_loop_overlap`` under the recorder.

Only the model forward (:mod:`.stand_ins.model_worker`) and the server plumbing (request intake,
output sending, metrics) are replaced; the scheduler, its pools, radix cache, policy, batch result
processing and FutureMap are SGLang's. :mod:`.environment` imports SGLang (installed, or a
user's tree) and selects its CUDA code paths on a CPU.
"""
