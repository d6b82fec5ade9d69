"""What Gemma 2 and Gemma 3 share (families gemma2 and gemma3): the settings both loaders derive,
the names of the sandwich norms in HF folders, and the (1 + w) norm weights folded in."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from met.model.config import ModelConfig, ModelLoadError
from met.model.families.spec import GgufGet

# Hugging Face names of a Gemma layer's norms: its post_attention_layernorm is the norm of the
# attention output (Llama's is the MLP's input norm), with a pre_feedforward_layernorm beside.
HF_LAYER_NORMS = {
    "post_attention_layernorm.weight": "post_attn_norm",
    "pre_feedforward_layernorm.weight": "mlp_norm",
    "post_feedforward_layernorm.weight": "post_mlp_norm",
}
# Gemma 3's multimodal checkpoints keep the text model under a prefix (newer and older spelling).
HF_TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.")


def swa_pattern(n_layers: int, period: int) -> list[bool]:
    """Which layers slide when every `period`-th one is global (the last of each period), as
    Gemma 2 (period 2) and Gemma 3 (period 6) interleave them; period 0: all slide."""
    return [period == 0 or i % period < period - 1 for i in range(n_layers)]


def apply_gemma_gguf(config: ModelConfig, get: GgufGet) -> None:
    """Gemma's settings from a GGUF file's `{arch}.` metadata (`get(key, default)`), with the
    defaults llama.cpp assumes where a key is absent."""
    gemma2 = config.architecture == "gemma2"
    window = get("attention.sliding_window", 4096 if gemma2 else None)
    config.sliding_window = int(window) if window and int(window) < config.context_length else None
    pattern = get("attention.sliding_window_pattern", 2 if gemma2 else 6)
    if isinstance(pattern, list):  # one flag per layer
        config.sliding_layers = [bool(p) for p in pattern]
    else:
        config.sliding_layers = swa_pattern(config.n_layers, int(pattern))
    local = get("rope.freq_base_swa", None if gemma2 else 10000.0)
    config.rope_local_theta = None if local is None else float(local)
    attn_cap = get("attn_logit_softcapping", 50.0 if gemma2 else None)
    final_cap = get("final_logit_softcapping", 30.0 if gemma2 else None)
    config.attn_softcap = float(attn_cap) if gemma2 and attn_cap else None
    config.final_softcap = float(final_cap) if final_cap else None
    # llama.cpp scales queries by 1/sqrt(hidden / heads) for the 27B models (told apart by
    # their layer count), by 1/sqrt(head_dim) otherwise; the file does not say.
    if config.n_layers == (46 if gemma2 else 62):
        config.query_scale = (config.hidden / config.n_heads) ** -0.5
    _common(config)


def apply_gemma_hf(config: ModelConfig, raw: dict[str, Any]) -> None:
    """Gemma's settings from a config.json (the text model's part of it)."""
    gemma2 = config.architecture == "gemma2"
    config.architecture = "gemma2" if gemma2 else "gemma3"  # gemma3_text is Gemma 3's text part
    config.qk_norm = not gemma2
    window = raw.get("sliding_window")
    config.sliding_window = int(window) if window and int(window) < config.context_length else None
    if raw.get("layer_types"):
        config.sliding_layers = [t == "sliding_attention" for t in raw["layer_types"]]
    else:
        period = raw.get("sliding_window_pattern", 2 if gemma2 else 6)
        config.sliding_layers = swa_pattern(config.n_layers, int(period))
    if not gemma2:
        config.rope_local_theta = float(raw.get("rope_local_base_freq", 10000.0))
    scalar = raw.get("query_pre_attn_scalar")
    config.query_scale = None if scalar is None else float(scalar) ** -0.5
    attn_cap, final_cap = raw.get("attn_logit_softcapping"), raw.get("final_logit_softcapping")
    config.attn_softcap = float(attn_cap) if attn_cap else None
    config.final_softcap = float(final_cap) if final_cap else None
    activation = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if activation not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ModelLoadError(f"Gemma's hidden_activation {activation!r} is not supported")
    _common(config)


def _common(config: ModelConfig) -> None:
    # Embeddings times sqrt(hidden), rounded to the activations' float32 as both HF and
    # llama.cpp do.
    config.embed_scale = float(torch.tensor(math.sqrt(config.hidden), dtype=torch.float32))
    config.post_norms = True
    config.activation = "gelu_tanh"
    if config.sliding_layers is not None and len(config.sliding_layers) != config.n_layers:
        raise ModelLoadError(
            f"the sliding-window pattern names {len(config.sliding_layers)} layers, the model "
            f"has {config.n_layers}"
        )


def fold_hf_norms(weights: dict[str, Tensor]) -> None:
    """Gemma's RMSNorms scale by (1 + w); the canonical weights hold the factor itself, as
    llama.cpp's converter stores it (computed in float32, as Gemma's own norm computes it)."""
    for name in list(weights):
        if name == "norm" or name.endswith("_norm"):
            weights[name] = (weights[name].float() + 1.0).to(weights[name].dtype)
