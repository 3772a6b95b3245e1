"""Engine adapters: a real inference engine's own overlap loop run under the recorder.

``core`` is engine-neutral (strict stubs, the sync-site scan, mutation by recompiling one
function, the necessity table, JSON); each engine (``sglang``) is an adapter on it that imports
the engine, builds its scheduler with strict stubs and names the variants. Nothing in ``core``
imports an adapter.
"""
