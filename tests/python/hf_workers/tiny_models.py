"""Tiny random Hugging Face models for the TP tests, built without any download.

A model is a config built here, its weights drawn with a seed, written with
`save_pretrained` to a folder; the ranks then load it the way users load a checkpoint:
`from_pretrained(folder)` for the unsharded twin and `from_pretrained(folder,
tp_plan=...)` for the tensor-parallel one (hf_tp.py).

Shapes: 2 layers, small hidden sizes, head counts that divide by 8 (TP 8 under
TPCHECK_TEST_LONG=1 shards the key/value heads too), a vocabulary that divides by 8 (the
LM head is colwise). Both families keep their library defaults otherwise (RoPE, RMSNorm,
SiLU MLP, SDPA attention, untied embeddings, initializer_range 0.02), but for the 1-D
parameters: the library starts RMSNorm weights at 1 and biases at 0, which a trained model
does not have (and a bias of 0 hides a wrongly sharded bias in the forward); each gets
0.1 * N(0, 1) added, from the same seed.

  llama   LlamaForCausalLM: multi-head attention (8 query and 8 key/value heads), no biases
  qwen2   Qwen2ForCausalLM: grouped-query attention (16 query heads, 8 key/value heads),
          biases on q/k/v (colwise: the bias is sharded with the weight)
"""

from __future__ import annotations

import os

# name -> (config class, model class, config arguments)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=8, num_key_value_heads=8, head_dim=16,
                   vocab_size=256, max_position_embeddings=128)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=16, num_key_value_heads=8, head_dim=8,
                   vocab_size=256, max_position_embeddings=128)),
}

# the inputs each job draws (tokens; batch x sequence)
BATCH, SEQ = 2, 16


def config(family: str, **overrides):
    import transformers
    cfg_name, _, kwargs = FAMILIES[family]
    return getattr(transformers, cfg_name)(**{**kwargs, **overrides})


def save_tiny(family: str, seed: int, folder: str, **overrides) -> str:
    """Builds `family` with weights drawn from `seed` and saves it (safetensors, float32)
    into `folder`; returns the folder."""
    import torch
    import transformers
    _, model_name, _ = FAMILIES[family]
    cfg = config(family, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    return folder
