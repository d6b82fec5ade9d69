"""Read a Hugging Face model folder of any family in met.model.families into ModelConfig +
weights: the fields every family shares here, the rest by the family's module."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from met.hf_blocks import weight_format
from met.model.config import ModelConfig, ModelLoadError, RopeScaling, check_weights
from met.model.families import FAMILIES, Family, hf_family
from met.model.families.spec import rope_settings
from met.model.fused import FUSED_GATE_UP, FUSED_QKV, split_fused
from met.model.linear import Weight

_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "embed",
    "lm_head.weight": "lm_head",
    "model.norm.weight": "norm",
}
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "wq",
    "self_attn.k_proj.weight": "wk",
    "self_attn.v_proj.weight": "wv",
    "self_attn.q_proj.bias": "bq",
    "self_attn.k_proj.bias": "bk",
    "self_attn.v_proj.bias": "bv",
    "self_attn.qkv_proj.weight": FUSED_QKV,  # Phi-3
    "mlp.gate_up_proj.weight": FUSED_GATE_UP,  # Phi-3: gate rows, then up rows
    "self_attn.q_norm.weight": "q_norm",
    "self_attn.k_norm.weight": "k_norm",
    "self_attn.o_proj.weight": "wo",
    "post_attention_layernorm.weight": "mlp_norm",
    "mlp.gate_proj.weight": "w_gate",
    "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down",
    "mlp.gate.weight": "router",  # Qwen3-MoE
    "block_sparse_moe.gate.weight": "router",  # Mixtral
}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")
# One expert's weights: Qwen3-MoE's mlp.experts.{e}.*_proj, Mixtral's block_sparse_moe w1/w3/w2.
_EXPERT_RE = re.compile(r"(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight")
_EXPERT_NAMES = {
    "gate_proj": "w_gate",
    "up_proj": "w_up",
    "down_proj": "w_down",
    "w1": "w_gate",
    "w3": "w_up",
    "w2": "w_down",
}


def is_hf_folder(path: str | Path) -> bool:
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


def read_hf_config(folder: str | Path) -> ModelConfig:
    folder = Path(folder)
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"{folder}: config.json is missing or unreadable ({exc}); "
            "point at a Hugging Face model folder"
        ) from exc
    model_type = raw.get("model_type")
    family = hf_family(model_type, folder)
    if isinstance(raw.get("text_config"), dict):  # a multimodal config (Gemma 3, Mistral 3)
        raw = {**raw, **raw["text_config"], "model_type": model_type}
    try:
        config = _config_from_json(raw, folder)
    except KeyError as exc:
        raise ModelLoadError(
            f"{folder}: config.json lacks {exc}; the folder is incomplete"
        ) from exc
    _longrope(raw, config, folder)
    _family_config(family, config, raw, folder)
    config.validate(str(folder))
    return config


def _family_config(family: Family, config: ModelConfig, raw: dict[str, Any], folder: Path) -> None:
    """What the family reads on top of the shared fields, and its layer plan."""
    config.family = family.name
    try:
        family.hf_config(config, raw)
    except KeyError as exc:
        raise ModelLoadError(
            f"{folder}: config.json lacks {exc}; the folder is incomplete"
        ) from exc
    except ModelLoadError as exc:
        raise ModelLoadError(f"{folder}: {exc}") from exc
    if config.layers is None:  # the family hook may have planned the layers itself
        config.layers = family.layers(config)


def _config_from_json(raw: dict[str, Any], folder: Path) -> ModelConfig:
    n_heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    eos = raw.get("eos_token_id")
    eos_ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    template_file = folder / "chat_template.jinja"
    template = (
        template_file.read_text()
        if template_file.is_file()
        else hf_chat_template(read_json(folder / "tokenizer_config.json"))
    )
    return ModelConfig(
        architecture=raw["model_type"],
        n_layers=int(raw["num_hidden_layers"]),
        n_heads=n_heads,
        n_kv_heads=int(raw.get("num_key_value_heads") or n_heads),
        hidden=hidden,
        head_dim=int(raw.get("head_dim") or hidden // n_heads),
        # Qwen3-MoE's experts have their own width; Mixtral's is intermediate_size.
        ffn=int(raw.get("moe_intermediate_size") or raw["intermediate_size"]),
        vocab=int(raw["vocab_size"]),
        rope_theta=float(raw.get("rope_theta") or rope_settings(raw).get("rope_theta", 10000.0)),
        context_length=int(raw.get("max_position_embeddings", 2048)),
        sliding_window=_sliding_window(raw),
        norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_ids=[int(e) for e in eos_ids],
        chat_template=template,
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        rope_scaling=_rope_scaling(rope_settings(raw), folder),
        attention_bias=bool(raw.get("attention_bias", False)),
    )


def _sliding_window(raw: dict[str, Any]) -> int | None:
    """The attention window (Mistral 7B v0.1's 4096) when it is narrower than the context;
    Qwen2 configs name a window but switch it off with use_sliding_window."""
    window = raw.get("sliding_window")
    length = int(raw.get("max_position_embeddings", 2048))
    if window and raw.get("use_sliding_window", True) and int(window) < length:
        return int(window)
    return None


def _longrope(raw: dict[str, Any], config: ModelConfig, folder: Path) -> None:
    """Phi-3's LongRoPE (`longrope`, formerly `su`): per-pair divisors, the long ones when the
    model serves more than its original context (as llama.cpp picks them), and the magnitude
    scale llama.cpp's converter derives from the context ratio."""
    scaling = rope_settings(raw)
    if (scaling.get("rope_type") or scaling.get("type")) not in ("longrope", "su"):
        return
    if float(raw.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ModelLoadError(f"{folder}: partial rotary (Phi-4-mini style) is not supported")
    original = int(raw.get("original_max_position_embeddings") or config.context_length)
    longer = config.context_length > original
    config.rope_freq_factors = [
        float(f) for f in scaling["long_factor" if longer else "short_factor"]
    ]
    scale = config.context_length / original
    if scale > 1.0:
        config.rope_attn_factor = math.sqrt(1 + math.log(scale) / math.log(original))


def _rope_scaling(raw: dict[str, Any] | None, folder: Path) -> RopeScaling | None:
    if not raw:
        return None
    kind = raw.get("rope_type") or raw.get("type")
    if kind in (None, "default", "longrope", "su"):  # LongRoPE: _longrope
        return None
    if kind not in ("linear", "llama3", "yarn"):
        raise ModelLoadError(
            f"{folder}: RoPE scaling {kind!r} is not supported (linear, llama3, yarn)"
        )
    return RopeScaling(
        kind=kind,
        factor=float(raw["factor"]),
        original_context=int(raw.get("original_max_position_embeddings", 0)),
        low_freq_factor=float(raw.get("low_freq_factor", 1.0)),
        high_freq_factor=float(raw.get("high_freq_factor", 4.0)),
        beta_fast=float(raw.get("beta_fast", 32.0)),
        beta_slow=float(raw.get("beta_slow", 1.0)),
        truncate=bool(raw.get("truncate", True)),
    )


def _shards(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise ModelLoadError(
            f"{folder}: no *.safetensors weights; download the model's safetensors files"
        )
    return shards


def _canonical_name(hf_name: str, family: Family) -> str | None:
    for prefix in family.hf_text_prefixes:
        if hf_name.startswith(prefix):
            rest = hf_name.removeprefix(prefix)
            hf_name = rest if rest.startswith("lm_head.") else "model." + rest
            break
    if hf_name in _GLOBAL_NAMES or hf_name in family.hf_names:
        return {**_GLOBAL_NAMES, **family.hf_names}[hf_name]
    match = _LAYER_RE.fullmatch(hf_name)
    names = {**_LAYER_NAMES, **family.hf_names}
    if match and match.group(2) in names:
        return f"layers.{match.group(1)}.{names[match.group(2)]}"
    expert = _EXPERT_RE.fullmatch(match.group(2)) if match else None
    if expert and expert.group(2) in _EXPERT_NAMES:
        return f"layers.{match.group(1)}.experts.{expert.group(1)}.{_EXPERT_NAMES[expert.group(2)]}"
    return None


def load_hf(
    folder: str | Path, dtype: torch.dtype = torch.float32, keep_blocks: bool = False
) -> tuple[ModelConfig, dict[str, Weight]]:
    """ModelConfig and canonical weights (CPU, `dtype`), read shard by shard, tensor by tensor.

    With keep_blocks (--weight-format gguf: the C++ forward's weights), the linear weights come
    as QuantLinear blocks: those the folder stores as blocks (gpt-oss's MXFP4 experts) as
    stored, the float ones quantized to Q8_0 (met.hf_blocks)."""
    folder = Path(folder)
    config = read_hf_config(folder)
    family = FAMILIES[config.family]
    weights: dict[str, torch.Tensor] = {}
    for shard in _shards(folder):
        try:
            with safe_open(str(shard), framework="pt") as f:
                for hf_name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    name = _canonical_name(hf_name, family)
                    if name is not None:
                        tensor = f.get_tensor(hf_name)
                        # Integer tensors are packed blocks (gpt-oss's MXFP4 experts), for
                        # the family's hf_weights to unpack.
                        weights[name] = tensor.to(dtype) if tensor.is_floating_point() else tensor
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelLoadError(
                f"{shard}: unreadable safetensors file ({exc}); download it again"
            ) from exc
    if "lm_head" not in weights:
        config.tie_embeddings = True
    family.hf_weights(weights)
    family.load_weights(weights, config, "hf")
    split_fused(weights, config, folder)
    weight_format(weights, dtype, keep_blocks, folder)
    check_weights(weights, config, folder)
    return config, weights


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file's object, {} when the file is absent."""
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: unreadable JSON ({exc}); download it again") from exc


def hf_chat_template(settings: dict[str, Any]) -> str | None:
    """The chat template from tokenizer_config.json settings."""
    template = settings.get("chat_template")
    if isinstance(template, list):  # named templates: the default one serves chat requests
        named = {t.get("name"): t.get("template") for t in template}
        return named.get("default")
    return template
