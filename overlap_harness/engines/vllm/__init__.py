"""The vLLM adapter: vLLM's own async-scheduling code (the V1 runner's async output and input
fence, Model Runner V2's AsyncOutput and UVA ring) driven under the recorder in CPU mode.
Import vLLM through :func:`environment.import_vllm`; drivers in :mod:`drivers`."""
