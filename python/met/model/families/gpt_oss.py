"""gpt-oss (`gpt-oss` in GGUF, `gpt_oss` in HF): every layer a mixture of experts routed by a
softmax over the top-k biased router logits, the experts' clamped SwiGLU with biases, attention
with biases on q/k/v/o and a learned sink logit per head, sliding (128) and full attention
alternating (layer 0 slides), YaRN RoPE, NEOX rotation (GGUF rows not permuted).

HF folders keep the experts stacked: gate_up_proj [E, H, 2F] (gate and up interleaved along the
last axis: gate at even columns), down_proj [E, F, H], or, as OpenAI ships them, MXFP4 blocks
and scales (gate_up_proj_blocks [E, 2F, H / 32, 16], _scales [E, 2F, H / 32]: gate at even
rows); they are split into the canonical per-expert weights here, MXFP4 ones as QuantLinear
blocks repacked into ggml's layout (met.model.mxfp4), which load_hf keeps or dequantizes.
YaRN's magnitude is transformers' attention factor for a folder and llama.cpp's
1 + 0.1 ln(factor) (times rope.scaling.attn_factor) for a file; llama.cpp always rounds YaRN's
ramp bounds, a folder says whether to (`truncate`)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from torch import Tensor

from met.kernels.cpu_quant import QuantLinear
from met.model.config import ModelConfig
from met.model.families.spec import (
    Family,
    GgufGet,
    LayerSpec,
    rope_settings,
    standard_layers,
    yarn_magnitude,
)
from met.model.linear import Weight
from met.model.mxfp4 import ggml_mxfp4

_SWA_PERIOD = 2  # llama.cpp's load_swa_pattern(ml, 2): even layers slide, odd ones attend fully

# Canonical names of the stacked HF expert tensors, split by _hf_weights.
_GATE_UP, _DOWN = "experts_gate_up", "experts_down"


def _layers(config: ModelConfig) -> list[LayerSpec]:
    return [replace(s, router="topk_softmax", sinks=True) for s in standard_layers(config)]


def _common(config: ModelConfig) -> None:
    config.activation = "swiglu_clamped"
    config.moe_norm_topk = True
    config.attention_bias = True


def _hf_config(config: ModelConfig, raw: dict[str, Any]) -> None:
    _common(config)
    config.n_experts = int(raw["num_local_experts"])
    # OpenAI's config.json names it both ways; transformers reads num_experts_per_tok.
    config.n_experts_used = int(raw.get("num_experts_per_tok") or raw["experts_per_token"])
    config.swiglu_limit = float(raw.get("swiglu_limit", 7.0))
    config.swiglu_alpha = float(raw.get("swiglu_alpha", 1.702))
    types = raw.get("layer_types") or [
        "sliding_attention" if i % _SWA_PERIOD == 0 else "full_attention"
        for i in range(config.n_layers)
    ]
    config.sliding_layers = [t == "sliding_attention" for t in types]
    window = raw.get("sliding_window")
    config.sliding_window = int(window) if window else None
    rope = rope_settings(raw)
    if (rope.get("rope_type") or rope.get("type")) == "yarn":
        config.rope_attn_factor = yarn_magnitude(rope)


def _gguf_config(config: ModelConfig, get: GgufGet) -> None:
    _common(config)
    config.sliding_layers = [i % _SWA_PERIOD == 0 for i in range(config.n_layers)]
    scaling = config.rope_scaling
    if scaling is not None and scaling.kind == "yarn" and scaling.factor > 1:
        magnitude = 1.0 + 0.1 * math.log(scaling.factor)
        config.rope_attn_factor = float(get("rope.scaling.attn_factor", 1.0)) * magnitude


def _stacked(weights: dict[str, Tensor], name: str) -> tuple[Tensor, int | None]:
    """A stacked expert tensor as [E, rows, cols] (rows: the outputs) and, for MXFP4, the input
    width: float, or the blocks repacked into ggml's layout [E, rows, G * 17] (load_hf keeps
    them for the C++ forward or dequantizes them)."""
    blocks = weights.pop(name + "_blocks", None)
    if blocks is not None:
        return ggml_mxfp4(blocks, weights.pop(name + "_scales")), blocks.shape[-2] * 32
    return weights.pop(name).transpose(1, 2), None  # HF multiplies x @ W: its columns, our rows


def _split(
    weights: dict[str, Weight], prefix: str, parts: dict[str, Tensor], width: int | None = None
) -> None:
    for part, stacked in parts.items():
        for e, expert in enumerate(stacked):
            weight = expert.contiguous()
            if width is not None:
                weight = QuantLinear(weight, "MXFP4", weight.shape[0], width)
            weights[f"{prefix}experts.{e}.{part}"] = weight


def _hf_weights(weights: dict[str, Weight]) -> None:
    """The stacked expert tensors (float or MXFP4) as canonical per-expert weights; gate and up
    are interleaved along the rows (gate first), in MXFP4 blocks as in float."""
    prefixes = {n.split(_GATE_UP)[0] for n in weights if _GATE_UP in n}
    for p in sorted(prefixes):
        gate_up, width = _stacked(weights, p + _GATE_UP)
        _split(weights, p, {"w_gate": gate_up[:, 0::2], "w_up": gate_up[:, 1::2]}, width)
        down, width = _stacked(weights, p + _DOWN)
        _split(weights, p, {"w_down": down}, width)
        bias = weights.pop(p + _GATE_UP + "_bias")
        down_bias = weights.pop(p + _DOWN + "_bias")
        _split(weights, p, {"b_gate": bias[:, 0::2], "b_up": bias[:, 1::2], "b_down": down_bias})


FAMILY = Family(
    name="gpt_oss",
    gguf_archs=("gpt-oss",),
    hf_types=("gpt_oss",),
    gguf_config=_gguf_config,
    hf_config=_hf_config,
    layers=_layers,
    hf_names={
        "self_attn.o_proj.bias": "bo",
        "self_attn.sinks": "sinks",
        "mlp.router.weight": "router",
        "mlp.router.bias": "b_router",
        **{
            f"mlp.experts.{hf}{suffix}": f"{ours}{suffix}"
            for hf, ours in (("gate_up_proj", _GATE_UP), ("down_proj", _DOWN))
            for suffix in ("", "_bias", "_blocks", "_scales")
        },
    },
    gguf_names={
        "post_attention_norm.weight": "mlp_norm",  # llama.cpp's attn_post_norm: the MLP's input
        "attn_output.bias": "bo",
        "attn_sinks.weight": "sinks",
        "ffn_gate_inp.bias": "b_router",
    },
    hf_weights=_hf_weights,
    turn_end_tokens=("<|return|>", "<|call|>"),  # harmony's ends of an assistant turn
    not_end_tokens=("<|end|>",),  # ends one message of the turn (analysis before final)
)
