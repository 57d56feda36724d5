"""The tiny Llama-shaped model the lab serves: a ``config.json``, a generation config and a
word-level tokenizer, made locally. vLLM serves it with ``--load-format dummy`` (random
weights), so nothing is downloaded.

The tokenizer maps each word ``w0``..``wN`` to one token and adds ``<s>`` in front, so a
prompt of n words is n + 1 prompt tokens: the load generator sets prompt lengths exactly.
Token 2 (``</s>``) ends a turn.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np

VOCAB = 1024
SPECIAL = ("<unk>", "<s>", "</s>")
BOS, EOS = 1, 2
WORDS = VOCAB - len(SPECIAL)

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": VOCAB,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}


def tokenizer_json() -> dict[str, object]:
    """A Hugging Face ``tokenizer.json``: WordLevel over whitespace, ``<s>`` prepended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(SPECIAL)}
    vocab.update({f"w{i}": len(SPECIAL) + i for i in range(WORDS)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", BOS)]
    )
    doc: dict[str, object] = json.loads(tok.to_str())
    return doc


def make(directory: Path, max_model_len: int, shape: Mapping[str, object] | None = None) -> Path:
    """Write the model's files into ``directory`` (made if need be); return it. ``shape``
    overrides fields of the config (a larger model: ``hidden_size``, ``num_hidden_layers``)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {**CONFIG, **(shape or {}), "max_position_embeddings": max_model_len}
    files = {
        "config.json": config,
        "generation_config.json": {"bos_token_id": BOS, "eos_token_id": EOS},
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": SPECIAL[BOS],
            "eos_token": SPECIAL[EOS],
            "unk_token": SPECIAL[0],
            "model_max_length": max_model_len,
        },
    }
    for name, doc in files.items():
        (directory / name).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return directory


def prompt(words: int, rng: random.Random) -> str:
    """``words`` random words: ``words`` + 1 prompt tokens with ``<s>``. Random, so two
    prompts share no cached prefix block (of 16 or more tokens) but by a vanishing chance."""
    return " ".join(f"w{n}" for n in rng.choices(range(WORDS), k=words))


ADAPTER_RANK = 8
ADAPTER_TARGETS = ("q_proj", "v_proj")


def make_adapters(directory: Path, count: int) -> dict[str, Path]:
    """``count`` LoRA adapters for the model, in PEFT's layout (``adapter_config.json`` and
    ``adapter_model.safetensors``, rank 8 on the attention's q and v projections, small
    random weights), as ``lora-00``, ``lora-01``, ...; name -> directory."""
    out: dict[str, Path] = {}
    hidden = CONFIG["hidden_size"]
    assert isinstance(hidden, int)
    for i in range(count):
        name = f"lora-{i:02d}"
        path = directory / name
        path.mkdir(parents=True, exist_ok=True)
        config = {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": ADAPTER_RANK,
            "lora_alpha": 2 * ADAPTER_RANK,
            "lora_dropout": 0.0,
            "bias": "none",
            "target_modules": list(ADAPTER_TARGETS),
            "base_model_name_or_path": str(directory.parent),
        }
        (path / "adapter_config.json").write_text(json.dumps(config, indent=1) + "\n")
        rng = np.random.default_rng(i)
        tensors: dict[str, np.ndarray] = {}
        for layer in range(int(CONFIG["num_hidden_layers"])):  # type: ignore[call-overload]
            for proj in ADAPTER_TARGETS:
                key = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
                a = rng.normal(0.0, 0.02, (ADAPTER_RANK, hidden)).astype(np.float32)
                b = rng.normal(0.0, 0.02, (hidden, ADAPTER_RANK)).astype(np.float32)
                tensors[f"{key}.lora_A.weight"] = a
                tensors[f"{key}.lora_B.weight"] = b
        _write_safetensors(path / "adapter_model.safetensors", tensors)
        out[name] = path
    return out


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """The safetensors format: a little-endian u64 header length, a JSON header of each
    tensor's dtype, shape and byte range, then the raw data."""
    header: dict[str, object] = {}
    offset, blobs = 0, []
    for name, arr in tensors.items():
        data = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))
