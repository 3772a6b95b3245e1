"""The harness's stand-ins for SGLang's own code: the model forward and workers, the kernels
(declared to the recorder), the attention backends and the stubbed packages. A race side in a
file of this folder is harness code standing in for an SGLang line, not SGLang's."""
