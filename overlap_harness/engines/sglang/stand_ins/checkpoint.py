"""The checkpoint configuration SGLang's own ``ModelConfig`` is built from: a tiny Llama.

The model config is a boundary the harness must give (the real one reads a checkpoint's
``config.json``), and which fields a release's loop reads of it differs between releases
(0.5.17 reads ``think_end_ids``, 0.5.23 ``self_opened_think_start_ids``). So it is not
stood in for field by field: SGLang's own ``ModelConfig.from_server_args`` reads a real
``config.json`` of a one-layer Llama whose sizes match the driver's pools (vocabulary 1000,
context 64, one KV head); no weights exist or are loaded.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

#: the tiny checkpoint's ``config.json`` (a Llama: a model type every release supports)
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000,
          "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
          "num_attention_heads": 1, "num_key_value_heads": 1,
          "max_position_embeddings": 64, "torch_dtype": "float16", "rms_norm_eps": 1e-5}


@functools.cache
def checkpoint_dir() -> Path:
    """A folder holding the tiny checkpoint's ``config.json`` (made once per process)."""
    folder = Path(tempfile.mkdtemp(prefix="overlap-harness-checkpoint-"))
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


def model_config(server_args: Any) -> Any:
    """SGLang's own ``ModelConfig`` for ``server_args``, read from the tiny checkpoint, with
    the model implementation the model loader resolves for a model SGLang implements."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.utils import ModelImpl

    config = ModelConfig.from_server_args(server_args, model_path=str(checkpoint_dir()))
    if hasattr(config, "_resolved_model_impl"):
        config._resolved_model_impl = ModelImpl.SGLANG
    return config
