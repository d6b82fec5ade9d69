"""What Qwen3.5 / Qwen3.6 (qwen35, qwen35moe) and Qwen3-Next (qwen3next) share: in each group of
`full_attention_interval` layers the last is gated full attention (per-head Q/K norms, partial
RoPE, the output times sigmoid of a gate projected beside Q) and the others are Gated DeltaNet
layers (model/deltanet.py); every norm but the DeltaNet's gated one scales by (1 + w); the MoE
variants add a sigmoid-gated shared expert to the routed ones.

Transforms of llama.cpp's converter (convert_hf_to_gguf.py, Qwen3NextModel and
_LinearAttentionVReorderBase) that the canonical weights undo or share: A_log stored as
ssm_a = -exp(A_log), dt_bias as ssm_dt.bias, the conv weight squeezed to [channels, kernel],
(1 + w) folded into the norms; Qwen3-Next's in_proj_qkvz (per key head q, k, v, z) split into
attn_qkv and attn_gate; and for Qwen3.5 with fewer key than value heads, the value heads
reordered from grouped by key head to tiled (head r * k_heads + h was h * ratio + r), which the
DeltaNet reads as it is (RecurrentShape.tiled): undoing it would permute ssm_out's columns, which
quantized blocks cannot. Quantized weights (QuantLinear, kept for met's matmul) are split by
whole rows, exact on the blocks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from met.kernels.cpu_quant import QuantLinear
from met.model.config import ModelConfig, ModelLoadError, RecurrentShape
from met.model.families.spec import Family, GgufGet, LayerSpec, rope_settings
from met.model.linear import Weight

HF_NAMES = {
    "linear_attn.in_proj_qkv.weight": "ssm_qkv",
    "linear_attn.in_proj_z.weight": "ssm_z",
    "linear_attn.in_proj_b.weight": "ssm_beta",
    "linear_attn.in_proj_a.weight": "ssm_alpha",
    "linear_attn.in_proj_qkvz.weight": "ssm_qkvz",  # Qwen3-Next: per key head q, k, v, z
    "linear_attn.in_proj_ba.weight": "ssm_ba",  # Qwen3-Next: per key head b, a
    "linear_attn.conv1d.weight": "ssm_conv",
    "linear_attn.dt_bias": "ssm_dt",
    "linear_attn.A_log": "ssm_a_log",
    "linear_attn.norm.weight": "ssm_norm",
    "linear_attn.out_proj.weight": "ssm_out",
    "mlp.shared_expert.gate_proj.weight": "shexp.w_gate",
    "mlp.shared_expert.up_proj.weight": "shexp.w_up",
    "mlp.shared_expert.down_proj.weight": "shexp.w_down",
    "mlp.shared_expert_gate.weight": "shexp_gate",
}
GGUF_NAMES = {
    "post_attention_norm.weight": "mlp_norm",  # these archs' name for the MLP's input norm
    "attn_qkv.weight": "ssm_qkv",
    "attn_gate.weight": "ssm_z",
    "ssm_beta.weight": "ssm_beta",
    "ssm_alpha.weight": "ssm_alpha",
    "ssm_ba.weight": "ssm_ba",
    "ssm_conv1d.weight": "ssm_conv",
    "ssm_dt.bias": "ssm_dt",
    "ssm_a": "ssm_a",
    "ssm_norm.weight": "ssm_norm",
    "ssm_out.weight": "ssm_out",
    "ffn_gate_inp_shexp.weight": "shexp_gate",
    "ffn_gate_shexp.weight": "shexp.w_gate",
    "ffn_up_shexp.weight": "shexp.w_up",
    "ffn_down_shexp.weight": "shexp.w_down",
}
# Multimodal Qwen3.5 checkpoints keep the text model here.
HF_TEXT_PREFIXES = ("model.language_model.",)


def plan(config: ModelConfig, recurrent: list[bool]) -> None:
    if len(recurrent) != config.n_layers:
        raise ModelLoadError(
            f"the layer pattern names {len(recurrent)} layers, the model has {config.n_layers}"
        )
    mlp = "moe" if config.n_experts else "dense"
    shared = bool(config.shared_ffn)
    config.layers = [
        LayerSpec(mixer="recurrent", mlp=mlp, shared_expert=shared)
        if r
        else LayerSpec(qk_norm="head", attn_gate=True, mlp=mlp, shared_expert=shared)
        for r in recurrent
    ]


def _every(n_layers: int, interval: int) -> list[bool]:
    return [(i + 1) % interval != 0 for i in range(n_layers)]


def apply_hf(config: ModelConfig, raw: dict[str, Any]) -> None:
    """The hybrid's settings from a config.json (the text model's part of it)."""
    if raw.get("mlp_only_layers") or int(raw.get("decoder_sparse_step", 1)) != 1:
        raise ModelLoadError(
            "dense layers between the sparse ones (mlp_only_layers, decoder_sparse_step) are "
            "not supported"
        )
    if raw.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"hidden_act {raw['hidden_act']!r} is not supported (silu)")
    config.qk_norm = True
    config.recurrent = RecurrentShape(
        k_heads=int(raw["linear_num_key_heads"]),
        v_heads=int(raw["linear_num_value_heads"]),
        k_dim=int(raw["linear_key_head_dim"]),
        v_dim=int(raw["linear_value_head_dim"]),
        kernel=int(raw.get("linear_conv_kernel_dim", 4)),
    )
    fraction = rope_settings(raw).get("partial_rotary_factor", raw.get("partial_rotary_factor"))
    config.rope_dims = int(config.head_dim * float(fraction if fraction is not None else 0.25))
    if raw.get("num_experts"):
        config.n_experts = int(raw["num_experts"])
        config.n_experts_used = int(raw["num_experts_per_tok"])
        config.moe_norm_topk = bool(raw.get("norm_topk_prob", True))
        config.shared_ffn = int(raw.get("shared_expert_intermediate_size") or 0)
    else:
        config.ffn = int(raw["intermediate_size"])
    types = raw.get("layer_types")
    if types:
        recurrent = [t == "linear_attention" for t in types]
    else:
        recurrent = _every(config.n_layers, int(raw.get("full_attention_interval", 4)))
    plan(config, recurrent)


def apply_gguf(config: ModelConfig, get: GgufGet) -> None:
    """The hybrid's settings from a GGUF file's `{arch}.` metadata, as llama.cpp reads them."""

    def need(key: str) -> int:
        value = get(key, None)
        if value is None:
            raise ModelLoadError(f"metadata {config.architecture}.{key} is missing")
        return int(value)

    # llama.cpp's converter appends the multi-token-prediction blocks (a draft head met does
    # not run) to block_count; the decoder is the blocks before them.
    config.n_layers -= int(get("nextn_predict_layers", 0) or 0)
    v_heads = need("ssm.time_step_rank")
    config.recurrent = RecurrentShape(
        k_heads=need("ssm.group_count"),
        v_heads=v_heads,
        k_dim=need("ssm.state_size"),
        v_dim=need("ssm.inner_size") // v_heads,
        kernel=need("ssm.conv_kernel"),
        tiled=config.architecture != "qwen3next",
    )
    config.qk_norm = True
    config.rope_dims = int(get("rope.dimension_count", config.head_dim // 4))
    config.shared_ffn = int(get("expert_shared_feed_forward_length", 0) or 0)
    if config.n_experts:
        config.moe_norm_topk = True  # llama.cpp's qwen35moe / qwen3next graphs renormalise
    flags = get("attention.recurrent_layers", None)
    if isinstance(flags, list):
        recurrent = [bool(f) for f in flags[: config.n_layers]]
    else:
        recurrent = _every(config.n_layers, int(get("full_attention_interval", 4)))
    plan(config, recurrent)


def load_weights(weights: dict[str, Weight], config: ModelConfig, fmt: str) -> None:
    """The canonical weights of either format: Q and its gate apart, Qwen3-Next's fused
    projections split, A as -exp(A_log), the conv as [channels, kernel], the shared expert's
    gate [1, H]; from HF the (1 + w) norms folded."""
    shape = config.recurrent
    for i, spec in enumerate(config.layer_specs()):
        p = f"layers.{i}."
        if spec.mixer == "attention":
            _split_query_gate(weights, p, config)
        else:
            _split_qwen3next(weights, p, shape)
            if p + "ssm_a_log" in weights:
                weights[p + "ssm_a"] = -torch.exp(weights.pop(p + "ssm_a_log").float())
            conv = weights[p + "ssm_conv"]
            weights[p + "ssm_conv"] = conv.reshape(conv.shape[0], -1)
        if p + "shexp_gate" in weights:
            weights[p + "shexp_gate"] = weights[p + "shexp_gate"].reshape(1, -1)
    if fmt == "hf":
        for name in list(weights):
            if (name == "norm" or name.endswith("_norm")) and not name.endswith("ssm_norm"):
                weights[name] = (weights[name].float() + 1.0).to(weights[name].dtype)


def _split_query_gate(weights: dict[str, Tensor], p: str, config: ModelConfig) -> None:
    # q_proj's rows are per head [query (head_dim), gate (head_dim)].
    wq = weights[p + "wq"]
    n = wq.out_features if isinstance(wq, QuantLinear) else wq.shape[0]
    if n != 2 * config.n_heads * config.head_dim:
        raise ModelLoadError(
            f"{p}wq has {n} rows, expected query and gate rows "
            f"({2 * config.n_heads * config.head_dim})"
        )
    rows = torch.arange(n).reshape(config.n_heads, 2, config.head_dim)
    weights[p + "wq"] = _rows(wq, rows[:, 0])
    weights[p + "wq_gate"] = _rows(wq, rows[:, 1])


def _rows(weight: Weight, index: Tensor) -> Weight:
    """The rows `index` of a weight, in that order."""
    index = index.reshape(-1)
    if isinstance(weight, QuantLinear):
        blocks = weight.blocks.index_select(0, index).contiguous()
        return QuantLinear(blocks, weight.qtype, len(index), weight.in_features)
    return weight.index_select(0, index).contiguous()


def _split_qwen3next(weights: dict[str, Weight], p: str, s: RecurrentShape) -> None:
    # HF's in_proj_qkvz / in_proj_ba: per key head its q, k, v, z (b, a) rows.
    ratio = s.v_heads // s.k_heads
    qkvz = weights.pop(p + "ssm_qkvz", None)
    if qkvz is not None:
        parts = [s.k_dim, s.k_dim, ratio * s.v_dim, ratio * s.v_dim]
        q, k, v, z = torch.arange(sum(parts) * s.k_heads).reshape(s.k_heads, -1).split(parts, 1)
        weights[p + "ssm_qkv"] = _rows(qkvz, torch.cat([x.reshape(-1) for x in (q, k, v)]))
        weights[p + "ssm_z"] = _rows(qkvz, z)
    ba = weights.pop(p + "ssm_ba", None)
    if ba is not None:
        b, a = torch.arange(2 * s.v_heads).reshape(s.k_heads, 2 * ratio).split([ratio, ratio], 1)
        weights[p + "ssm_beta"], weights[p + "ssm_alpha"] = _rows(ba, b), _rows(ba, a)


def hybrid_family(
    name: str, hf_types: tuple[str, ...], text_prefixes: tuple[str, ...] = HF_TEXT_PREFIXES
) -> Family:
    """One of the hybrid families: GGUF arch `name`, the HF model_types given, read as above."""
    return Family(
        name=name,
        gguf_archs=(name,),
        hf_types=hf_types,
        gguf_config=apply_gguf,
        hf_config=apply_hf,
        hf_names=HF_NAMES,
        gguf_names=GGUF_NAMES,
        hf_text_prefixes=text_prefixes,
        load_weights=load_weights,
    )
