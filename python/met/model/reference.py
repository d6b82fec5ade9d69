"""A deliberately plain dense forward, used by tests to check the paged, packed LlamaModel.

It shares nothing with llama.py beyond the weight names: unfused projections, RoPE through complex
multiplication, K/V repeated per query head, softmax attention written out, mixture-of-experts
MLPs as every expert on every token under a dense routing matrix, full recompute of one sequence
at a time.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from met.model.config import ModelConfig


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    return x * torch.rsqrt(variance + eps) * weight


def _rope(x: Tensor, config: ModelConfig) -> Tensor:
    """x [heads, T, dim] at positions 0..T-1; pairs (i, i + dim/2) rotate as complex numbers."""
    n_pos, half = x.shape[1], x.shape[2] // 2
    inv_freq = torch.tensor(config.inv_freq(), dtype=torch.float64)
    angles = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    # a * e^{i * angle}, [T, half]; a is 1 except under Phi-3's LongRoPE.
    rotation = torch.polar(torch.full_like(angles, config.rope_attn_factor), angles)
    pairs = torch.complex(x[..., :half].double(), x[..., half:].double()) * rotation
    return torch.cat([pairs.real, pairs.imag], dim=-1).to(x.dtype)


def _attention(x: Tensor, w: dict[str, Tensor], p: str, config: ModelConfig) -> Tensor:
    n_tok, hd = x.shape[0], config.head_dim

    def project(name: str, heads: int) -> Tensor:
        out = x @ w[p + "w" + name].T
        if p + "b" + name in w:
            out = out + w[p + "b" + name]
        out = out.view(n_tok, heads, hd)
        if p + name + "_norm" in w:  # Qwen3: each head normalized on its own, before RoPE
            out = _rms_norm(out, w[p + name + "_norm"], config.norm_eps)
        return out.transpose(0, 1)  # [heads, T, dim]

    q = _rope(project("q", config.n_heads), config)
    k = _rope(project("k", config.n_kv_heads), config)
    v = project("v", config.n_kv_heads)
    repeat = config.n_heads // config.n_kv_heads
    k, v = k.repeat_interleave(repeat, dim=0), v.repeat_interleave(repeat, dim=0)
    scores = q @ k.transpose(1, 2) / math.sqrt(hd)
    future = torch.ones(n_tok, n_tok, dtype=torch.bool).triu(diagonal=1)
    if config.sliding_window:  # and the past beyond the window
        future |= torch.ones(n_tok, n_tok, dtype=torch.bool).tril(-config.sliding_window)
    probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    out = (probs @ v).transpose(0, 1).reshape(n_tok, config.n_heads * hd)
    return out @ w[p + "wo"].T


def _mlp(h: Tensor, w: dict[str, Tensor], p: str) -> Tensor:
    gate = h @ w[p + "w_gate"].T
    return (gate * torch.sigmoid(gate) * (h @ w[p + "w_up"].T)) @ w[p + "w_down"].T


def moe_mlp(h: Tensor, w: dict[str, Tensor], p: str, config: ModelConfig) -> Tensor:
    """Every expert on every token, weighted by a dense [T, E] routing matrix that is zero
    outside each token's top k. Mixtral's formulation (softmax over the top-k logits) for a
    renormalising model, Qwen3-MoE's (top-k of the softmax, as is) for one that does not.
    Checked once against transformers 5.23 (Qwen3MoeForCausalLM with norm_topk_prob true and
    false, MixtralForCausalLM) on the tests' tiny folders: within 2.7e-7 of the largest logit."""
    logits = (h @ w[p + "router"].T).float()
    top, ids = torch.topk(logits, config.n_experts_used, dim=-1)
    if config.moe_norm_topk:
        picked = torch.softmax(top, dim=-1)
    else:
        picked = torch.softmax(logits, dim=-1).gather(-1, ids)
    routing = torch.zeros_like(logits).scatter(-1, ids, picked).to(h.dtype)
    out = torch.zeros_like(h)
    for e in range(config.n_experts):
        out += routing[:, e : e + 1] * _mlp(h, w, f"{p}experts.{e}.")
    return out


@torch.inference_mode()
def reference_logits(
    config: ModelConfig, weights: dict[str, Tensor], token_ids: list[int]
) -> Tensor:
    """Float32 logits [len(token_ids), vocab] of one sequence, computed in the weights' dtype."""
    w = weights
    x = w["embed"][torch.tensor(token_ids)]
    for i in range(config.n_layers):
        p = f"layers.{i}."
        x = x + _attention(_rms_norm(x, w[p + "attn_norm"], config.norm_eps), w, p, config)
        h = _rms_norm(x, w[p + "mlp_norm"], config.norm_eps)
        x = x + (moe_mlp(h, w, p, config) if config.n_experts else _mlp(h, w, p))
    head = w["embed"] if config.tie_embeddings else w["lm_head"]
    return (_rms_norm(x, w["norm"], config.norm_eps) @ head.T).float()
