"""A GGUF file's metadata read into a ModelConfig (the decoder's shape, its family's settings,
the chat metadata), as llama.cpp names the keys; met.gguf_loader reads the tensors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFReader

from met.gguf_split import SplitGGUF
from met.model.config import ModelConfig, ModelLoadError, RopeScaling
from met.model.families import gguf_family


def field_value(reader: GGUFReader | SplitGGUF, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_config(reader: GGUFReader | SplitGGUF, path: str | Path) -> ModelConfig:
    """The decoder's shape and the chat metadata, as llama.cpp names them."""
    arch = field_value(reader, "general.architecture")
    family = gguf_family(arch, path)

    def get(key: str, default: Any = None) -> Any:
        value = field_value(reader, f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(
                f"{path}: metadata {arch}.{key} is missing; the file is incomplete"
            )
        return value

    n_heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    tokens = field_value(reader, "tokenizer.ggml.tokens", [])
    # Chat models may end a turn with a token other than EOS (Llama 3's <|eot_id|>).
    eos_keys = ("eos_token_id", "eot_token_id", "eom_token_id")
    eos = [field_value(reader, f"tokenizer.ggml.{k}") for k in eos_keys]
    # A turn may end with a token other than EOS (Gemma's <end_of_turn>: llama.cpp stops there).
    eos += [tokens.index(t) for t in family.turn_end_tokens if t in tokens]
    # A token the family never ends on (gpt-oss's <|end|>), even where the file names it.
    never = {tokens.index(t) for t in family.not_end_tokens if t in tokens}
    eos = [e for e in eos if e not in never]
    config = ModelConfig(
        architecture=arch,
        family=family.name,
        n_layers=int(get("block_count")),
        n_heads=n_heads,
        n_kv_heads=_first(get("attention.head_count_kv", n_heads)),
        hidden=hidden,
        head_dim=int(get("attention.key_length", hidden // n_heads)),
        # A MoE's experts have their own width (Qwen3-MoE); Mixtral's is feed_forward_length.
        ffn=_first(
            field_value(reader, f"{arch}.expert_feed_forward_length") or get("feed_forward_length")
        ),
        vocab=int(get("vocab_size", len(tokens))),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        context_length=int(get("context_length", 2048)),
        norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        bos_token_id=field_value(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=list(dict.fromkeys(int(e) for e in eos if e is not None)),
        chat_template=field_value(reader, "tokenizer.chat_template"),
        tie_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        rope_scaling=_rope_scaling(reader, arch),
        attention_bias=any(t.name.endswith("attn_q.bias") for t in reader.tensors),
        qk_norm=any(t.name.endswith("attn_q_norm.weight") for t in reader.tensors),
        rope_attn_factor=float(get("rope.scaling.attn_factor", 1.0)),
        n_experts=int(get("expert_count", 0)),
        n_experts_used=int(get("expert_used_count", 0)),
    )

    # llama.cpp's gating functions: 1 softmax (Qwen3-MoE, Mixtral), 2 sigmoid (DeepSeek-V3).
    gating = field_value(reader, f"{arch}.expert_gating_func")
    if gating not in (None, 1):
        raise ModelLoadError(
            f"{path}: expert gating function {gating} is not supported (softmax routing only)"
        )
    window = field_value(reader, f"{arch}.attention.sliding_window")
    if window and int(window) < config.context_length:
        config.sliding_window = int(window)
    try:
        family.gguf_config(config, lambda key, dflt: field_value(reader, f"{arch}.{key}", dflt))
    except ModelLoadError as exc:
        raise ModelLoadError(f"{path}: {exc}") from None
    rotated = int(get("rope.dimension_count", config.head_dim))
    if rotated != config.head_dim and not config.rope_dims:
        raise ModelLoadError(
            f"{path}: RoPE over {rotated} of {config.head_dim} head dimensions (partial rotary) "
            "is not supported"
        )
    if config.layers is None:  # the family hook may have planned the layers itself
        config.layers = family.layers(config)
    family.gguf_tensors(config, {t.name for t in reader.tensors})
    config.validate(str(path))
    return config


def _first(value: Any) -> int:
    """A per-layer array's first entry (Gemma 4's KV heads and MLP widths; its family reads
    the rest), or the value itself."""
    return int(value[0] if isinstance(value, list) else value)


def _rope_scaling(reader: GGUFReader | SplitGGUF, arch: str) -> RopeScaling | None:
    kind = field_value(reader, f"{arch}.rope.scaling.type")
    factor = field_value(reader, f"{arch}.rope.scaling.factor")
    if kind in (None, "none") or not factor:
        return None
    if kind not in ("linear", "yarn"):
        raise ModelLoadError(
            f"RoPE scaling {kind!r} is not supported (only linear, llama3 and yarn)"
        )
    original = field_value(reader, f"{arch}.rope.scaling.original_context_length", 0)
    fast = field_value(reader, f"{arch}.rope.scaling.yarn_beta_fast", 32.0)
    slow = field_value(reader, f"{arch}.rope.scaling.yarn_beta_slow", 1.0)
    return RopeScaling(
        kind=kind,
        factor=float(factor),
        original_context=int(original),
        beta_fast=float(fast),
        beta_slow=float(slow),
    )
