"""A model's ``config.json`` (Llama 3.1 8B's shape, trimmed to what the KV-cache budget
reads) that the tests of bad and hostile input change one field at a time."""

from __future__ import annotations

from typing import Any

CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}
