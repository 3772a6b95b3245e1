"""``overlap-harness sglang --gpu``: the same driven loop on a CUDA device, the CPU mode's
verdicts checked by forcing each race and comparing values with the serial answer."""
