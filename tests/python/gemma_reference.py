"""A plain dense Gemma 2 / Gemma 3 forward written from the Hugging Face modeling code's
semantics, over an HF config dict and HF-named weights: it shares nothing with met's loaders
or forward (no canonical names, no folded norms, no paging), one sequence recomputed whole."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    # Gemma's RMSNorm: float32, scaled by (1 + w).
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())


def _sliding(config: dict, layer: int) -> bool:
    if config.get("layer_types"):
        return config["layer_types"][layer] == "sliding_attention"
    period = config.get("sliding_window_pattern", 2 if config["model_type"] == "gemma2" else 6)
    return (layer + 1) % period != 0


def _rope(x: Tensor, theta: float, factor: float) -> Tensor:
    """x [heads, T, dim], positions 0..T-1; rotate-half pairs (i, i + dim / 2) as complex."""
    dim = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim) / factor
    angles = torch.arange(x.shape[1], dtype=torch.float64)[:, None] * inv[None, :]
    half = dim // 2
    z = torch.complex(x[..., :half].double(), x[..., half:].double()) * torch.polar(
        torch.ones_like(angles), angles
    )
    return torch.cat([z.real, z.imag], dim=-1).float()


def _attention(config: dict, w: dict, p: str, h: Tensor, layer: int) -> Tensor:
    n, hd = h.shape[0], config["head_dim"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    gemma3 = config["model_type"] != "gemma2"
    q = (h @ w[p + "q_proj.weight"].T).view(n, heads, hd).transpose(0, 1)
    k = (h @ w[p + "k_proj.weight"].T).view(n, kv_heads, hd).transpose(0, 1)
    v = (h @ w[p + "v_proj.weight"].T).view(n, kv_heads, hd).transpose(0, 1)
    if gemma3:
        q = _norm(q, w[p + "q_norm.weight"], config["rms_norm_eps"])
        k = _norm(k, w[p + "k_norm.weight"], config["rms_norm_eps"])
    sliding = _sliding(config, layer)
    theta, factor = config["rope_theta"], 1.0
    if gemma3 and sliding:
        theta = config["rope_local_base_freq"]
    elif config.get("rope_scaling"):
        factor = config["rope_scaling"]["factor"]
    q, k = _rope(q, theta, factor), _rope(k, theta, factor)
    k = k.repeat_interleave(heads // kv_heads, 0)
    v = v.repeat_interleave(heads // kv_heads, 0)
    scores = q @ k.transpose(1, 2) * config["query_pre_attn_scalar"] ** -0.5
    if config.get("attn_logit_softcapping"):
        cap = config["attn_logit_softcapping"]
        scores = torch.tanh(scores / cap) * cap
    i = torch.arange(n)
    masked = i[None, :] > i[:, None]
    if sliding:
        masked |= i[None, :] <= i[:, None] - config["sliding_window"]
    probs = torch.softmax(scores.masked_fill(masked, -math.inf), dim=-1)
    out = (probs @ v).transpose(0, 1).reshape(n, heads * hd)
    return out @ w[p + "o_proj.weight"].T


@torch.inference_mode()
def gemma_logits(config: dict, w: dict[str, Tensor], tokens: list[int]) -> Tensor:
    """Float32 logits [len(tokens), vocab]."""
    eps = config["rms_norm_eps"]
    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    x = x * torch.tensor(config["hidden_size"] ** 0.5, dtype=x.dtype)
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = _norm(x, w[p + "input_layernorm.weight"], eps)
        h = _attention(config, w, p + "self_attn.", h, layer)
        x = x + _norm(h, w[p + "post_attention_layernorm.weight"], eps)
        h = _norm(x, w[p + "pre_feedforward_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        h = torch.nn.functional.gelu(gate, approximate="tanh") * (h @ w[p + "mlp.up_proj.weight"].T)
        h = h @ w[p + "mlp.down_proj.weight"].T
        x = x + _norm(h, w[p + "post_feedforward_layernorm.weight"], eps)
    logits = _norm(x, w["model.norm.weight"], eps) @ w["model.embed_tokens.weight"].T
    if config.get("final_logit_softcapping"):
        cap = config["final_logit_softcapping"]
        logits = torch.tanh(logits / cap) * cap
    return logits.float()
