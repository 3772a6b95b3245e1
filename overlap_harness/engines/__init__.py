"""Engine adapters: a real inference engine's own overlap code run under the recorder.

Each engine (``vllm``) imports the engine, builds its objects with strict stubs (only the
model forward and server plumbing faked) and names what it drives; the engine-neutral pieces
(mutation by recompiling one function, strict stubs) are shared by every adapter.
"""
