"""SGLang's switches and components the loop is driven with, one module each: what a variant
needs of the scheduler build for EAGLE, DSpark, CUDA-graph decode, grammar, DP attention,
unified memory, ... (the rest of each is SGLang's own code)."""
