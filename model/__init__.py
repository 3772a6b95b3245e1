"""The protocol under study and the device API it is written against.

Nothing here imports simpy, CUDA-only code, ``sim`` or ``gpu_check``: the same protocol code
runs on the simulated device (``sim``) and on real CUDA streams (``gpu_check``).
"""
