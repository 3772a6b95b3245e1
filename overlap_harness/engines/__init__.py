"""Engine adapters: a real inference engine's own overlap loop run under the recorder.

``core`` is engine-neutral (strict stubs, the sync-site scan, mutation by recompiling one
function, the necessity table, JSON); each engine (``sglang``, ``vllm``) is an adapter that
imports the engine, builds its scheduler or runner with strict stubs (only the model forward
and server plumbing faked) and names the variants. Nothing in ``core`` imports an adapter.
"""
