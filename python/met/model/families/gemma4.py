"""Gemma 4 (text part; `gemma4` in GGUF, `gemma4`/`gemma4_text` in HF), dense and MoE.

Gemma's sandwich norms, GeLU(tanh), scaled embeddings and final-logit soft-cap, with: per-head
Q/K norms and V RMS-normalized without a weight, queries unscaled (the norms replace 1/sqrt(d));
sliding layers (their own, narrower heads and RoPE base, fully rotated) interleaved with global
ones (wider heads, "proportional" RoPE: only the first quarter of each half's pairs rotate, with
frequencies over the whole head; the rest stay put), which in the larger models take V from the
K projection and have fewer KV heads; the last num_kv_shared_layers layers project only Q and
attend over the K/V of the last earlier layer of their own kind (transformers' kv_sharing_modes;
llama.cpp takes the last two non-shared layers, sliding then global, which is the same layer for
the released models, whose last non-shared layer is global); per-layer embeddings (E2B/E4B); a
learned scale per layer output; MoE layers (26B-A4B) run the dense MLP and the experts side by
side, the router reading the residual stream (met.model.moe.ScaledRouter). Norm weights multiply
as stored (no 1 + w). The vision and audio towers of a multimodal checkpoint are not read.

Proportional RoPE as llama.cpp's converter stores it: per-pair divisors (rope_freqs), 1 for the
rotated pairs and 1e30 for the others (here from a config.json: infinity, so their angle is 0).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from met.model.config import ModelConfig, ModelLoadError
from met.model.families.gemma import HF_TEXT_PREFIXES, swa_pattern
from met.model.families.spec import Family, GgufGet, LayerSpec
from met.model.fused import split_expert_gate_up

_HF_NAMES = {
    "post_attention_layernorm.weight": "post_attn_norm",
    "pre_feedforward_layernorm.weight": "mlp_norm",
    "post_feedforward_layernorm.weight": "post_mlp_norm",
    "layer_scalar": "out_scale",
    "per_layer_input_gate.weight": "ple_gate",
    "per_layer_projection.weight": "ple_proj",
    "post_per_layer_input_norm.weight": "ple_norm",
    "router.proj.weight": "router",
    "router.scale": "router_scale",
    "router.per_expert_scale": "expert_scale",
    "experts.gate_up_proj": "experts.*.w_gate_up",  # [E, 2F, H], split by _hf_weights
    "experts.down_proj": "experts.*.w_down",
    "pre_feedforward_layernorm_2.weight": "moe_norm",
    "post_feedforward_layernorm_1.weight": "post_mlp_norm_1",
    "post_feedforward_layernorm_2.weight": "post_moe_norm",
    "model.embed_tokens_per_layer.weight": "ple_embed",
    "model.per_layer_model_projection.weight": "ple_model_proj",
    "model.per_layer_projection_norm.weight": "ple_proj_norm",
}
_GGUF_NAMES = {
    "per_layer_token_embd.weight": "ple_embed",
    "per_layer_model_proj.weight": "ple_model_proj",
    "per_layer_proj_norm.weight": "ple_proj_norm",
    "inp_gate.weight": "ple_gate",
    "proj.weight": "ple_proj",
    "post_norm.weight": "ple_norm",
    "layer_output_scale.weight": "out_scale",
    "ffn_gate_inp.scale": "router_scale",
    "ffn_down_exps.scale": "expert_scale",
    "pre_ffw_norm_2.weight": "moe_norm",
    "post_ffw_norm_1.weight": "post_mlp_norm_1",
    "post_ffw_norm_2.weight": "post_moe_norm",
}


def _plan(
    config: ModelConfig,
    sliding: list[bool],
    swa_heads: tuple[int, int],
    n_shared: int,
    k_as_v: bool,
) -> None:
    """The layer plan (config.head_dim and n_kv_heads are the global layers'; swa_heads the
    sliding layers' KV heads and head width)."""
    n = config.n_layers
    config.sliding_layers = sliding
    # Embeddings times sqrt(hidden) rounded to float32, as both implementations compute it.
    config.embed_scale = float(torch.tensor(math.sqrt(config.hidden), dtype=torch.float32))
    config.activation = "gelu_tanh"
    config.query_scale = 1.0
    if len(sliding) != n:
        raise ModelLoadError(f"the layer types name {len(sliding)} layers, the model has {n}")
    if not 0 <= n_shared < n:
        raise ModelLoadError(f"{n_shared} shared-KV layers of {n}: some layer must own its KV")
    first_shared = n - n_shared
    for n_kv in (config.n_kv_heads, swa_heads[0]):
        if n_kv <= 0 or config.n_heads % n_kv:
            raise ModelLoadError(f"{config.n_heads} heads are not a multiple of {n_kv} KV heads")
    specs = []
    for i, slides in enumerate(sliding):
        source = None
        if i >= first_shared:
            owners = [j for j in range(first_shared) if sliding[j] == slides]
            if not owners:
                raise ModelLoadError(f"shared-KV layer {i} has no earlier layer of its kind")
            source = owners[-1]
        specs.append(
            LayerSpec(
                window=config.sliding_window if slides else None,
                rope="local" if slides else "global",
                qk_norm="head",
                norms="sandwich",
                mlp="dense+moe" if config.n_experts else "dense",
                router="scaled" if config.n_experts else "softmax",
                head_dim=swa_heads[1] if slides else None,
                n_kv_heads=swa_heads[0] if slides else None,
                kv_source=source,
                k_as_v=k_as_v and not slides and source is None,
                v_norm=True,
                per_layer_input=config.per_layer_dim > 0,
            )
        )
    config.layers = specs


def _proportional(config: ModelConfig, fraction: float, factor: float) -> None:
    # transformers' _compute_proportional_rope_parameters: int(fraction * head_dim // 2) pairs
    # rotate, at base ** (-2i / head_dim) / factor; the others not at all.
    half = config.head_dim // 2
    rotated = int(fraction * config.head_dim // 2)
    config.rope_freq_factors = [factor] * rotated + [float("inf")] * (half - rotated)


def _hf_heads(raw: dict[str, Any], sliding: list[bool]) -> tuple[int, int | None]:
    """The global layers' head width and KV heads (None: as the sliding layers'), from
    global_head_dim / num_global_key_value_heads or, as transformers 5 saves them, from
    per_layer_config."""
    per_layer = {int(k): v for k, v in (raw.get("per_layer_config") or {}).items()}
    full = next((per_layer.get(i, {}) for i, s in enumerate(sliding) if not s), {})
    head_dim = raw.get("global_head_dim") or full.get("head_dim") or 512
    n_kv = raw.get("num_global_key_value_heads") if raw.get("attention_k_eq_v") else None
    return int(head_dim), int(n_kv or full.get("num_key_value_heads") or 0) or None


def _hf_config(config: ModelConfig, raw: dict[str, Any]) -> None:
    config.architecture = "gemma4"
    if raw.get("use_bidirectional_attention") == "all":
        raise ModelLoadError("Gemma 4 with bidirectional attention everywhere is not supported")
    activation = raw.get("hidden_activation") or "gelu_pytorch_tanh"
    if activation not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ModelLoadError(f"Gemma 4's hidden_activation {activation!r} is not supported")
    types = raw.get("layer_types") or [
        "full_attention" if not s else "sliding_attention" for s in swa_pattern(config.n_layers, 6)
    ]
    sliding = [t == "sliding_attention" for t in types]
    swa_heads = (config.n_kv_heads, config.head_dim)
    config.head_dim, n_kv = _hf_heads(raw, sliding)
    config.n_kv_heads = n_kv or config.n_kv_heads
    window = raw.get("sliding_window")
    config.sliding_window = int(window) if window and int(window) < config.context_length else None
    rope = raw.get("rope_parameters") or {}
    local, full = rope.get("sliding_attention", {}), rope.get("full_attention", {})
    config.rope_local_theta = float(local.get("rope_theta", 10000.0))
    config.rope_theta = float(full.get("rope_theta", 1000000.0))
    config.rope_scaling = None
    if full.get("rope_type", "default") == "proportional":
        _proportional(
            config, float(full.get("partial_rotary_factor", 1.0)), float(full.get("factor", 1.0))
        )
    elif full.get("rope_type", "default") != "default":
        raise ModelLoadError(f"Gemma 4's global RoPE {full.get('rope_type')!r} is not supported")
    cap = raw.get("final_logit_softcapping")
    config.final_softcap = float(cap) if cap else None
    config.per_layer_dim = int(raw.get("hidden_size_per_layer_input") or 0)
    if raw.get("enable_moe_block"):
        config.n_experts = int(raw["num_experts"])
        config.n_experts_used = int(raw["top_k_experts"])
    _plan(
        config,
        sliding,
        swa_heads,
        int(raw.get("num_kv_shared_layers") or 0),
        bool(raw.get("attention_k_eq_v")),
    )


def _gguf_config(config: ModelConfig, get: GgufGet) -> None:
    pattern = get("attention.sliding_window_pattern", None)
    if not isinstance(pattern, list):  # llama.cpp requires the per-layer array too
        raise ModelLoadError(
            "gemma4.attention.sliding_window_pattern (one flag per layer) is missing"
        )
    sliding = [bool(s) for s in pattern]
    n_kv = get("attention.head_count_kv", config.n_kv_heads)
    per_layer_kv = n_kv if isinstance(n_kv, list) else [n_kv] * config.n_layers
    swa_kv = next((int(k) for k, s in zip(per_layer_kv, sliding, strict=False) if s), 0)
    config.n_kv_heads = next(
        (int(k) for k, s in zip(per_layer_kv, sliding, strict=False) if not s), config.n_kv_heads
    )
    swa_dim = int(get("attention.key_length_swa", config.head_dim))
    rotated = int(get("rope.dimension_count_swa", swa_dim))
    if rotated != swa_dim:
        raise ModelLoadError(f"RoPE over {rotated} of the sliding layers' {swa_dim} dimensions")
    window = get("attention.sliding_window", None)
    config.sliding_window = int(window) if window and int(window) < config.context_length else None
    config.rope_local_theta = float(get("rope.freq_base_swa", 10000.0))
    cap = get("final_logit_softcapping", None)
    config.final_softcap = float(cap) if cap else None
    config.per_layer_dim = int(get("embedding_length_per_layer_input", 0))
    # Which layers take V from K the file says by its tensors: _gguf_tensors.
    _plan(
        config,
        sliding,
        (swa_kv or config.n_kv_heads, swa_dim),
        int(get("attention.shared_kv_layers", 0)),
        k_as_v=False,
    )


def _gguf_tensors(config: ModelConfig, names: set[str]) -> None:
    """llama.cpp's graph takes V from the K projection in a layer without attn_v (the larger
    models' global layers, converted from attention_k_eq_v)."""
    config.layers = [
        replace(s, k_as_v=s.own_kv and f"blk.{i}.attn_v.weight" not in names)
        for i, s in enumerate(config.layer_specs())
    ]


def _hf_weights(weights: dict[str, Tensor]) -> None:
    """Each expert's slice of transformers' stacked [E, rows, cols] expert tensors."""
    for name in [n for n in weights if ".experts.*." in n]:
        stacked = weights.pop(name)
        for e, part in enumerate(stacked):
            weights[name.replace("*", str(e))] = part.contiguous()
    split_expert_gate_up(weights)


FAMILY = Family(
    name="gemma4",
    gguf_archs=("gemma4",),
    hf_types=("gemma4", "gemma4_text"),
    gguf_config=_gguf_config,
    gguf_tensors=_gguf_tensors,
    hf_config=_hf_config,
    hf_names=_HF_NAMES,
    gguf_names=_GGUF_NAMES,
    hf_text_prefixes=HF_TEXT_PREFIXES,
    hf_weights=_hf_weights,
    # A turn ends at <turn|>; a turn that calls tools at <|tool_response>, where the template
    # puts the results.
    turn_end_tokens=("<turn|>", "<|tool_response>"),
)
