"""A model's shape from its Hugging Face ``config.json``, read the way vLLM reads it.

Layers, attention heads, KV heads and head dimension decide the KV cache; vLLM's rules
(``vllm/config/model.py``) are followed: the KV heads come from ``num_key_value_heads`` (or
its older spellings) and default to the attention heads; ``head_dim`` falls back to
``hidden_size // num_attention_heads``; a model with ``kv_lora_rank`` caches the MLA latent;
a float32 checkpoint is served in bfloat16. Multimodal configs keep the language model's
fields under ``text_config``.

The parameter count, for the weights, is an *estimate* from the shapes: embeddings (twice
unless ``tie_word_embeddings`` is true), attention (GQA or MLA projections), a gated MLP of
three matrices, and for mixture-of-experts models every expert, shared experts and the
router. Norms and biases are left out (well under 0.1%). Quantized checkpoints are counted
at their weight width (the layers they keep in 16 bits too, so it errs low).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Keys vLLM reads, in its order of preference (the first one is named in errors).
LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
HEADS = ("num_attention_heads", "n_head")
KV_HEADS = ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num")
HIDDEN = ("hidden_size", "n_embd", "d_model")
HEAD_DIM = ("head_dim", "hidden_size_per_head")
MAX_LEN = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
EXPERTS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
SERVED_DTYPE = {"bfloat16": "bfloat16", "float16": "float16", "half": "float16"}
# vLLM's --dtype auto downcasts float32 checkpoints to the GPU's preferred 16-bit type.
SERVED_DTYPE |= {"float32": "bfloat16", "float": "bfloat16"}


# No layer count, head count, width, vocabulary or context length comes near this (10^12).
LARGEST = 10**12


class ConfigFieldError(ValueError):
    """A field of a model config is missing or unusable; ``field`` names it."""

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


class HfConfig:
    """The language model's part of a config.json, with field names for errors."""

    def __init__(self, raw: Mapping[str, Any]):
        if not isinstance(raw, Mapping):
            raise ConfigFieldError("(top level)", "must be a JSON object")
        text = raw.get("text_config")
        if isinstance(text, Mapping) and not any(k in raw for k in LAYERS):
            self.raw, self.prefix, self.top = text, "text_config.", raw
        else:
            self.raw, self.prefix, self.top = raw, "", raw

    def field(self, key: str) -> str:
        return self.prefix + key

    def value(self, *keys: str) -> tuple[str, Any] | None:
        """The first of ``keys`` that is set (not null)."""
        for key in keys:
            if self.raw.get(key) is not None:
                return key, self.raw[key]
        return None

    def need(self, *keys: str) -> int:
        """A positive whole number from the first of ``keys`` that is set; required."""
        found = self.count(*keys)
        if found is None:
            raise ConfigFieldError(self.field(keys[0]), "is missing")
        return found

    def count(self, *keys: str) -> int | None:
        """A positive whole number from the first of ``keys`` that is set, or None."""
        found = self.value(*keys)
        if found is None:
            return None
        value = self._whole(*found)
        if value <= 0:
            raise ConfigFieldError(self.field(found[0]), f"must be positive, not {value}")
        return value

    def optional(self, key: str) -> int:
        """A whole number that may be absent or zero (then 0)."""
        found = self.value(key)
        value = 0 if found is None else self._whole(*found)
        if value < 0:
            raise ConfigFieldError(self.field(key), f"must not be negative, not {value}")
        return value

    def _whole(self, key: str, value: Any) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigFieldError(self.field(key), f"must be a whole number, not {value!r}")
        if abs(value) > LARGEST:
            raise ConfigFieldError(
                self.field(key), f"must be at most {LARGEST:.0e} (no model is larger)"
            )
        return value

    def flag(self, key: str) -> bool:
        return self.raw.get(key) is True

    def served_dtype(self) -> str:
        for cfg, prefix in ((self.raw, self.prefix), (self.top, "")):
            for key in ("dtype", "torch_dtype"):
                value = cfg.get(key)
                if value is None:
                    continue
                name = str(value).lower().removeprefix("torch.")
                if name not in SERVED_DTYPE:
                    raise ConfigFieldError(prefix + key, f"unknown dtype {value!r}")
                return SERVED_DTYPE[name]
        return "bfloat16"  # vLLM's choice when the config names none (float32 -> bf16)

    def max_model_len(self) -> int:
        """vLLM's derived limit: the smallest of the length keys; 0 when none is set."""
        lengths = [self.count(k) for k in MAX_LEN]
        override = self.count("model_max_length")
        if override:
            return override
        return min((n for n in lengths if n), default=0)


def head_dim(cfg: HfConfig, heads: int) -> int:
    explicit = cfg.count(*HEAD_DIM)
    if explicit is not None:
        return explicit
    hidden = cfg.count(*HIDDEN)
    if hidden is None:
        raise ConfigFieldError(
            cfg.field("hidden_size"),
            "is missing, and so is head_dim (head_dim = hidden_size / num_attention_heads)",
        )
    if hidden < heads:
        raise ConfigFieldError(
            cfg.field("hidden_size"), f"{hidden} is smaller than num_attention_heads ({heads})"
        )
    return hidden // heads


def kv_heads(cfg: HfConfig, heads: int) -> int:
    if cfg.flag("multi_query") and not cfg.flag("new_decoder_architecture"):
        return 1  # GPTBigCode, Falcon-7B: one KV head
    found = cfg.count(*KV_HEADS)
    return heads if found is None else found


def weight_bytes_per_param(cfg: HfConfig) -> float:
    """Bytes per weight: 2 unless ``quantization_config`` says a narrower width."""
    q = cfg.top.get("quantization_config") or cfg.raw.get("quantization_config")
    if not q:
        return 2.0
    if not isinstance(q, Mapping):
        raise ConfigFieldError("quantization_config", "must be a JSON object")
    method = str(q.get("quant_method", "")).lower()
    for key in ("bits", "w_bit", "weight_bits"):
        if q.get(key) is not None:
            return _bits(q[key], f"quantization_config.{key}") / 8
    if method in ("fp8", "fbgemm_fp8", "ptpc_fp8") or q.get("fmt") in ("e4m3", "e5m2"):
        return 1.0
    if method == "bitsandbytes":
        return 0.5 if q.get("load_in_4bit") else 1.0
    if method == "mxfp4":
        return 0.5
    if method == "compressed-tensors":
        groups = q.get("config_groups")
        bits: list[int] = [
            _bits(
                g["weights"]["num_bits"],
                f"quantization_config.config_groups.{name}.weights.num_bits",
            )
            for name, g in (groups.items() if isinstance(groups, Mapping) else ())
            if isinstance(g, Mapping)
            and isinstance(g.get("weights"), Mapping)
            and g["weights"].get("num_bits") is not None
        ]
        if bits:
            return max(bits) / 8
    raise ConfigFieldError(
        "quantization_config.quant_method",
        f"cannot tell the width of {method or 'unnamed'!r} weights",
    )


def _bits(value: Any, field: str) -> int:
    """A weight's width in bits: a whole number from 1 to 64 (not ``true``, not a number of
    hundreds of digits, which no float can hold)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64:
        shown = repr(value)
        shown = shown if len(shown) <= 24 else f"{shown[:12]}... ({len(shown)} characters)"
        raise ConfigFieldError(field, f"must be a whole number of bits from 1 to 64, not {shown}")
    return value


def estimate_params(cfg: HfConfig) -> float:
    """The parameter count from the shapes (see the module's docstring for what counts)."""
    layers = cfg.need(*LAYERS)
    heads = cfg.need(*HEADS)
    hidden = cfg.need(*HIDDEN)
    vocab = cfg.need("vocab_size", "padded_vocab_size")
    attention = _attention_params(cfg, hidden, heads)
    dense_mlp = 3 * hidden * cfg.need("intermediate_size", "ffn_hidden_size")
    experts = cfg.count(*EXPERTS) or 0
    if experts > 1:
        per_expert = 3 * hidden * cfg.optional("moe_intermediate_size")
        if not per_expert:
            per_expert = dense_mlp
        shared = cfg.optional("n_shared_experts") * per_expert
        shared += 3 * hidden * cfg.optional("shared_expert_intermediate_size")
        moe_mlp = experts * per_expert + shared + experts * hidden
        dense_layers = cfg.optional("first_k_dense_replace")
        only = cfg.raw.get("mlp_only_layers")
        dense_layers += len(only) if isinstance(only, list) else 0
        dense_layers = min(dense_layers, layers)
        mlp = dense_layers * dense_mlp + (layers - dense_layers) * moe_mlp
    else:
        mlp = layers * dense_mlp
    tied = cfg.raw.get("tie_word_embeddings", cfg.top.get("tie_word_embeddings")) is True
    embeddings = vocab * hidden * (1 if tied else 2)
    return float(embeddings + layers * attention + mlp)


def _attention_params(cfg: HfConfig, hidden: int, heads: int) -> int:
    rank = cfg.optional("kv_lora_rank")
    if not rank:
        dim = head_dim(cfg, heads)
        kv = kv_heads(cfg, heads)
        return 2 * hidden * heads * dim + 2 * hidden * kv * dim  # q, o; k, v
    rope = cfg.need("qk_rope_head_dim")
    nope = cfg.need("qk_nope_head_dim")
    v_dim = cfg.need("v_head_dim")
    q_rank = cfg.optional("q_lora_rank")
    q = hidden * heads * (nope + rope)
    if q_rank:
        q = hidden * q_rank + q_rank * heads * (nope + rope)
    kv_down = hidden * (rank + rope)
    kv_up = rank * heads * (nope + v_dim)
    return q + kv_down + kv_up + heads * v_dim * hidden
