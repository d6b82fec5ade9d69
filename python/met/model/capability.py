"""The capability table: which forward (torch, C++ CPU, CUDA) runs which model feature.

A model's features follow from its per-layer plan (met.model.families.spec) and the model-wide
settings of its config; each forward declares the features it implements. A forward missing one
of a model's features cannot run it: `refusal` says so in one line naming the feature and a forward
that runs it, `cannot_run` adds the conditions of one loaded model (device, dtype, weights,
parallelism), and `capability_row` is the model's row as `met doctor --model` prints it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from met.kernels.cpu_quant import QuantLinear
from met.model.config import ModelConfig, ModelLoadError
from met.model.linear import RowParts

if TYPE_CHECKING:
    from met.model.families.spec import LayerSpec
    from met.model.llama import LlamaModel

FORWARDS = {"torch": "the torch forward", "cpu": "the C++ CPU forward", "cuda": "the CUDA forward"}
# How to get each forward instead, for a refusal's one line.
_HOW = {
    "torch": "--weight-format dequantized",
    "cpu": "--device cpu --weight-format gguf",
    "cuda": "--device cuda",
}

SLIDING = "sliding-window attention"
LOCAL_ROPE = "a local RoPE base"
NO_ROPE = "no-RoPE layers"
HEAD_QK_NORM = "per-head Q/K norms"
FULL_QK_NORM = "whole-projection Q/K norms"
POST_NORMS = "post-sublayer norms"
NO_PRE_NORMS = "layers without pre-norms"
MOE = "mixture-of-experts MLPs"
RECURRENT = "recurrent layers"
ATTN_GATE = "gated attention output"
PARTIAL_ROPE = "partial RoPE"
SHARED_EXPERT = "gated shared experts"
GELU = "GeLU(tanh) MLPs"
ATTN_SOFTCAP = "attention soft-capping"
FINAL_SOFTCAP = "final-logit soft-capping"
EMBED_SCALE = "scaled embeddings"
QUERY_SCALE = "a query scale"
QUERY_TEMPERATURE = "query temperature"
ROPE_MAGNITUDE = "scaled RoPE magnitude"
SINKS = "attention sinks"
TOPK_ROUTER = "top-k softmax routing"  # gpt-oss's, with its router and expert biases
CLAMPED_SWIGLU = "clamped SwiGLU experts"
LAYER_HEADS = "per-layer head widths"
SHARED_KV = "shared-KV layers"
K_AS_V = "V from the K projection"
V_NORM = "V norms"
PER_LAYER_INPUTS = "per-layer embeddings"
DENSE_AND_MOE = "dense and MoE MLPs side by side"
SCALED_ROUTER = "scaled MoE routers"
# Gemma 4's (the 31B's, the small models' per-layer embeddings, the 26B's MoE).
_GEMMA4 = (LAYER_HEADS, SHARED_KV, K_AS_V, V_NORM, PER_LAYER_INPUTS, DENSE_AND_MOE, SCALED_ROUTER)

FEATURES = (
    SLIDING,
    LOCAL_ROPE,
    NO_ROPE,
    HEAD_QK_NORM,
    FULL_QK_NORM,
    POST_NORMS,
    NO_PRE_NORMS,
    MOE,
    RECURRENT,
    ATTN_GATE,
    PARTIAL_ROPE,
    SHARED_EXPERT,
    GELU,
    ATTN_SOFTCAP,
    FINAL_SOFTCAP,
    EMBED_SCALE,
    QUERY_SCALE,
    QUERY_TEMPERATURE,
    ROPE_MAGNITUDE,
    SINKS,
    TOPK_ROUTER,
    CLAMPED_SWIGLU,
    *_GEMMA4,
)
# What each forward implements (the basic layer, pre-norm attention with RoPE and a dense
# SiLU-gated MLP, biases and context-extended RoPE frequencies, every forward runs).
IMPLEMENTS: dict[str, frozenset[str]] = {
    "torch": frozenset(FEATURES),
    "cpu": frozenset(FEATURES),
    "cuda": frozenset(),
}


def model_features(config: ModelConfig) -> list[str]:
    """The features `config`'s model needs beyond the basic layer, in FEATURES order."""
    needed: set[str] = set()
    for spec in config.layer_specs():
        needed |= {
            name
            for name, used in (
                (SLIDING, spec.window is not None),
                (LOCAL_ROPE, spec.rope == "local"),
                (NO_ROPE, spec.rope == "none"),
                (HEAD_QK_NORM, spec.qk_norm == "head"),
                (FULL_QK_NORM, spec.qk_norm == "full"),
                (POST_NORMS, spec.post_norms),
                (NO_PRE_NORMS, not spec.pre_norms),
                (MOE, spec.mlp == "moe"),
                (RECURRENT, spec.mixer == "recurrent"),
                (SINKS, spec.sinks),
                (TOPK_ROUTER, spec.mlp == "moe" and spec.router == "topk_softmax"),
                (LAYER_HEADS, _own_heads(config, spec)),
                (SHARED_KV, not spec.own_kv),
                (K_AS_V, spec.k_as_v),
                (V_NORM, spec.v_norm),
                (PER_LAYER_INPUTS, spec.per_layer_input),
                (DENSE_AND_MOE, spec.mlp == "dense+moe"),
                (SCALED_ROUTER, spec.router == "scaled"),
                (ATTN_GATE, spec.attn_gate),
                (SHARED_EXPERT, spec.shared_expert),
            )
            if used
        }
    for name, used in (
        (GELU, config.activation == "gelu_tanh"),
        (CLAMPED_SWIGLU, config.activation == "swiglu_clamped"),
        (ATTN_SOFTCAP, bool(config.attn_softcap)),
        (FINAL_SOFTCAP, bool(config.final_softcap)),
        (EMBED_SCALE, config.embed_scale != 1.0),
        (QUERY_SCALE, config.query_scale is not None),
        (QUERY_TEMPERATURE, bool(config.attn_temp_scale)),
        (ROPE_MAGNITUDE, config.rope_attn_factor != 1.0),
        (PARTIAL_ROPE, config.rope_dims not in (0, config.head_dim)),
    ):
        if used:
            needed.add(name)
    return [name for name in FEATURES if name in needed]


def _own_heads(config: ModelConfig, spec: LayerSpec) -> bool:
    return spec.head_dim not in (None, config.head_dim) or spec.n_kv_heads not in (
        None,
        config.n_kv_heads,
    )


def missing(config: ModelConfig, forward: str) -> list[str]:
    """The model's features `forward` does not implement."""
    return [name for name in model_features(config) if name not in IMPLEMENTS[forward]]


def _label(config: ModelConfig) -> str:
    return config.family or config.architecture


def refusal(config: ModelConfig, forward: str) -> str | None:
    """One line saying why `forward` cannot run the model and which forward would; None when
    it can."""
    lacking = missing(config, forward)
    if not lacking:
        return None
    others = [f for f in FORWARDS if f != forward and not missing(config, f)]
    instead = f"; {FORWARDS[others[0]]} runs it ({_HOW[others[0]]})" if others else ""
    return f"{_label(config)}: {FORWARDS[forward]} does not implement {', '.join(lacking)}{instead}"


def require(config: ModelConfig, forward: str, source: object) -> None:
    """Refuse, at load, a model `forward` cannot run (ModelLoadError with refusal's line)."""
    line = refusal(config, forward)
    if line:
        raise ModelLoadError(f"{source}: {line}")


def capability_row(config: ModelConfig) -> str:
    """The model's row of the table: its features, then yes or what is missing per forward."""
    cells = []
    for forward in FORWARDS:
        lacking = missing(config, forward)
        cells.append(f"{forward} " + (f"no ({', '.join(lacking)})" if lacking else "yes"))
    features = ", ".join(model_features(config)) or "basic layers only"
    return f"{_label(config)} [{features}]: {'; '.join(cells)}"


def cannot_run(model: LlamaModel, forward: str) -> str | None:
    """Why the loaded `model` cannot run through `forward` ("cpu" or "cuda"), None when it can:
    the model's features (refusal), then what this load of it allows."""
    condition = _CONDITIONS[forward](model)
    return condition or refusal(model.config, forward)


def _cpu_conditions(model: LlamaModel) -> str | None:
    if model.device.type != "cpu" or model.dtype != torch.float32:
        return "the C++ forward runs float32 on the CPU"
    if model.reduce is not None:
        return "tensor parallelism runs the torch forward"
    linears = [model.lm_head]
    if model.ple is not None:
        linears.append(model.ple.model_proj)
    # Fused projections may be row parts in several formats (RowParts), which the forward
    # matmuls part by part; every other weight is one block matrix.
    fused = []
    for layer in model.layers:
        fused += [layer[n] for n in ("wqkv", "w_gate_up") if n in layer]
        linears += [layer[n] for n in ("wo", "w_down", "ple_gate", "ple_proj") if n in layer]
        if "deltanet" in layer:
            fused.append(layer["deltanet"].w_in)
            linears.append(layer["deltanet"].w_out)
        moe = layer.get("moe")
        if moe is not None and len(moe.experts) != moe.n_experts:
            return "expert parallelism runs the torch forward"
        if moe is not None:
            linears += [w for pair in moe.experts.values() for w in pair]
        if moe is not None and moe.shared is not None:
            linears += list(moe.shared[1])
    linears += [part for w in fused for part in (w.parts if isinstance(w, RowParts) else [w])]
    if not all(isinstance(w, QuantLinear) for w in linears):
        return "some linear weights are not GGUF blocks the C++ kernels read"
    return None


def _cuda_conditions(model: LlamaModel) -> str | None:
    from met.kernels import cuda_ops

    if model.device.type != "cuda":
        return "met's kernels run on a CUDA device"
    if not cuda_ops.available():
        return "met._core was built without CUDA"
    if model.reduce is not None:
        return "tensor parallelism runs the torch forward"
    if model.config.head_dim % 8 or model.config.head_dim > 256:
        return "paged attention takes head_dim a multiple of 8, at most 256"
    return None


_CONDITIONS = {"cpu": _cpu_conditions, "cuda": _cuda_conditions}
