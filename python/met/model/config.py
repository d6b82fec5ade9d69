"""What the loaders read out of a model file, in one shape for GGUF and Hugging Face folders."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from met.model.families.spec import LayerSpec

# Weight names both loaders produce (per layer i), so the forward never sees a file's own naming:
# embed [V, H], lm_head [V, H] (absent when tied), norm [H];
# layers.{i}.attn_norm, .wq [nh*hd, H], .wk/.wv [nkv*hd, H], .wo [H, nh*hd],
# .bq/.bk/.bv (Qwen2 only), .q_norm/.k_norm [hd] (Qwen3, Gemma 3), .mlp_norm,
# .w_gate/.w_up [F, H], .w_down [H, F]; .post_attn_norm/.post_mlp_norm (Gemma 2/3: the norms of
# each sublayer's output before it joins the residual). A mixture-of-experts model (Qwen3-MoE,
# Mixtral) has instead of w_gate/w_up/w_down a .router [E, H] and per expert e
# .experts.{e}.w_gate/.w_up [F, H], .experts.{e}.w_down [H, F], F the expert's width (ffn).
# A layer without pre-norms (OLMo 2) has no attn_norm/mlp_norm; whole-projection Q/K norms (OLMo 2)
# are q_norm [nh*hd], k_norm [nkv*hd]. gpt-oss adds .bo [H] (the output projection's bias),
# .sinks [nh] (attention sinks), .b_router [E] and per expert .b_gate/.b_up [F], .b_down [H].
# Gemma 4: a shared-KV layer has no wk/wv/k_norm, a K-as-V layer no wv; its MoE layers have,
# beside the dense MLP, the experts' .moe_norm (their input norm), .post_mlp_norm_1 and
# .post_moe_norm (the two outputs' norms), .router_scale [H] and .expert_scale [E]; .out_scale [1]
# scales a layer's output; per-layer embeddings: ple_embed [V, L*D], ple_model_proj [L*D, H],
# ple_proj_norm [D], per layer .ple_gate [D, H], .ple_proj [H, D], .ple_norm [H].
# A gated attention layer (Qwen3.5) has .wq_gate [nh*hd, H] beside wq. A recurrent layer (Gated
# DeltaNet) has instead of wq..wo the RECURRENT_WEIGHTS: .ssm_qkv [2*kh*kd + vh*vd, H] (q, k, v
# channels, value heads grouped by key head), .ssm_z [vh*vd, H], .ssm_beta/.ssm_alpha [vh, H],
# .ssm_conv [conv_dim, kernel], .ssm_dt [vh] (dt_bias), .ssm_a [vh] (-exp(A_log)), .ssm_norm
# [vd] (the gated norm's weight, as stored), .ssm_out [H, vh*vd]. A shared expert (Qwen3-Next
# MoE) is .shexp_gate [1, H] and .shexp.w_gate/.w_up [F_shared, H], .shexp.w_down.
# Q/K rows are in rotate-half (Hugging Face) order. Norm weights multiply as stored (Gemma's
# (1 + w) is folded in by the loaders, as llama.cpp's converter does).


RECURRENT_WEIGHTS = (
    "ssm_qkv",
    "ssm_z",
    "ssm_beta",
    "ssm_alpha",
    "ssm_conv",
    "ssm_dt",
    "ssm_a",
    "ssm_norm",
    "ssm_out",
)
SHARED_EXPERT_WEIGHTS = ("shexp_gate", "shexp.w_gate", "shexp.w_up", "shexp.w_down")


class ModelLoadError(RuntimeError):
    """A model file or folder could not be read; the message names the path and the fix."""


@dataclass(frozen=True)
class RopeScaling:
    """RoPE context extension. `kind` is "linear", "llama3" (Llama 3.1's banded rescale) or
    "yarn" (YaRN's ramp between interpolated and original frequencies, Ministral 3)."""

    kind: str
    factor: float
    original_context: int
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0  # yarn: rotations per context where the ramp starts and ends
    beta_slow: float = 1.0
    truncate: bool = True  # yarn: round the ramp's bounds outwards (gpt-oss's HF config: no)


@dataclass
@dataclass(frozen=True)
class RecurrentShape:
    """A Gated DeltaNet layer's shape (Qwen3.5 / Qwen3-Next): k_heads query/key heads of k_dim,
    v_heads value heads of v_dim (each key head serves v_heads / k_heads consecutive value
    heads), a depthwise causal conv1d of `kernel` taps over the q, k, v channels."""

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    kernel: int
    # Value head j reads key head j % k_heads (llama.cpp's GGUF layout, its converter's "tiled"
    # order) instead of j // (v_heads / k_heads) (Hugging Face's, grouped by key head).
    tiled: bool = False

    @property
    def conv_dim(self) -> int:
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim

    @property
    def value_width(self) -> int:
        return self.v_heads * self.v_dim


@dataclass
class ModelConfig:
    # The file's own name for it: a GGUF general.architecture or an HF model_type (the family
    # module that read it is `family`).
    architecture: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float
    context_length: int
    norm_eps: float
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    chat_template: str | None = None
    tie_embeddings: bool = False
    rope_scaling: RopeScaling | None = None
    attention_bias: bool = False  # Qwen2: q/k/v projections carry biases
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on Q and K before RoPE
    # GGUF files of Llama 3.1-style models store the rescale as per-pair divisors instead.
    # Phi-3's LongRoPE keeps them too (its long or short factors, by the context served).
    rope_freq_factors: list[float] | None = None
    # Phi-3's LongRoPE: cos and sin are scaled by this (so attention scores by its square).
    rope_attn_factor: float = 1.0
    # Sliding-window attention (Mistral 7B v0.1): a query at position p attends to keys
    # p - window + 1 .. p only; None: the whole context.
    sliding_window: int | None = None
    # Mixture of experts (every layer's MLP): E experts of width `ffn`, k used per token, their
    # top-k routing weights renormalised to sum to 1 when moe_norm_topk (model/moe.py).
    n_experts: int = 0
    n_experts_used: int = 0
    moe_norm_topk: bool = True
    # Which layers slide (Gemma: interleaved with global ones); None: every layer, when windowed.
    sliding_layers: list[bool] | None = None
    # Gemma 3: the sliding layers' RoPE base (their RoPE is never rescaled); None: rope_theta.
    rope_local_theta: float | None = None
    # Gemma 2/3: query_pre_attn_scalar ** -0.5 (None: 1 / sqrt(head_dim)), tanh soft-capping
    # of attention scores and of the final logits (None: none), embeddings times sqrt(hidden),
    # post-sublayer norms, GeLU (tanh) instead of SiLU in the gated MLP.
    query_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    embed_scale: float = 1.0
    post_norms: bool = False
    activation: str = "silu"  # "silu" | "gelu_tanh" | "swiglu_clamped"
    # gpt-oss's clamped SwiGLU (activation "swiglu_clamped"): gate clamped above and up on both
    # sides at swiglu_limit, then gate * sigmoid(swiglu_alpha * gate) * (up + 1).
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702
    # Llama 4-style query temperature (Ministral 3): queries at position p are scaled after RoPE
    # by 1 + attn_temp_scale * ln(1 + floor(p / attn_temp_length)); 0: none.
    attn_temp_scale: float = 0.0
    attn_temp_length: int = 0
    # The family module the loaders read this model with (met.model.families), and its plan per
    # layer; "" and None for a config built by hand, whose plan follows from the fields above.
    family: str = ""
    layers: list[LayerSpec] | None = None
    # Per-layer embeddings (Gemma 4's small models): the width of each layer's slice; 0: none.
    per_layer_dim: int = 0
    # Partial RoPE (Qwen3.5 / Qwen3-Next): only the first rope_dims of each head rotate; 0: all.
    rope_dims: int = 0
    # Hybrid models: the recurrent layers' shape and the MoE's gated shared expert's width (0:
    # none).
    recurrent: RecurrentShape | None = None
    shared_ffn: int = 0

    def layer_specs(self) -> list[LayerSpec]:
        """What each layer is (met.model.families.spec), as the forwards execute it."""
        from met.model.families.spec import standard_layers

        return self.layers if self.layers is not None else standard_layers(self)

    def kv_layers(self) -> list[int]:
        """The layers that keep K/V in the paged pool: every attention layer (not a recurrent
        one, whose state lives in the recurrent pool)."""
        return [i for i, spec in enumerate(self.layer_specs()) if spec.mixer == "attention"]

    def attn_temperature(self, position: int) -> float:
        """The query scale at `position` (1 without query temperature)."""
        if not self.attn_temp_scale:
            return 1.0
        return 1.0 + self.attn_temp_scale * math.log(1.0 + position // self.attn_temp_length)

    def validate(self, source: str) -> None:
        """Reject shapes the forward cannot run, naming the file they came from."""
        if self.n_heads % max(self.n_kv_heads, 1) != 0:
            raise ModelLoadError(
                f"{source}: {self.n_heads} attention heads are not a multiple of "
                f"{self.n_kv_heads} KV heads; the file's metadata is inconsistent"
            )
        if min(self.n_layers, self.hidden, self.head_dim, self.ffn, self.vocab) <= 0:
            raise ModelLoadError(f"{source}: model dimensions must be positive: {self}")
        if self.n_experts and not 0 < self.n_experts_used <= self.n_experts:
            raise ModelLoadError(
                f"{source}: {self.n_experts_used} experts used per token of {self.n_experts}; "
                "the file's metadata is inconsistent"
            )
        if self.head_dim % 2:
            raise ModelLoadError(f"{source}: head_dim {self.head_dim} must be even for RoPE")

    def inv_freq(self, local: bool = False, head_dim: int | None = None) -> list[float]:
        """RoPE inverse frequencies per rotated pair, with any context-extension rescale applied
        (local: the sliding layers' own, never rescaled), for heads of `head_dim` (default the
        config's; a layer may have its own, Gemma 4); partial RoPE (rope_dims) rotates only the
        first rope_dims of each head."""
        dim = self.rope_dims or head_dim or self.head_dim
        theta = self.rope_local_theta if local else self.rope_theta
        freqs = [theta ** (-2.0 * i / dim) for i in range(dim // 2)]
        if local:
            return freqs
        if self.rope_freq_factors is not None:
            return [f / d for f, d in zip(freqs, self.rope_freq_factors, strict=True)]
        scaling = self.rope_scaling
        if scaling is None:
            return freqs
        if scaling.kind == "linear":
            return [f / scaling.factor for f in freqs]
        if scaling.kind == "yarn":
            return _yarn(freqs, scaling, theta, dim)
        return [_llama3_rescale(f, scaling) for f in freqs]


def _llama3_rescale(freq: float, s: RopeScaling) -> float:
    # Long wavelengths are slowed by `factor`, short ones are left alone, the band between is
    # interpolated smoothly (Llama 3.1's published formula).
    wavelen = 2 * math.pi / freq
    low_wavelen = s.original_context / s.low_freq_factor
    high_wavelen = s.original_context / s.high_freq_factor
    if wavelen < high_wavelen:
        return freq
    if wavelen > low_wavelen:
        return freq / s.factor
    smooth = (s.original_context / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    return (1 - smooth) * freq / s.factor + smooth * freq


def _yarn(freqs: list[float], s: RopeScaling, theta: float, dim: int) -> list[float]:
    # YaRN: pairs turning more than beta_fast times over the original context keep their
    # frequency, those turning fewer than beta_slow times are interpolated (divided by factor),
    # a linear ramp over the pairs between (bounds rounded outwards, as HF and llama.cpp do).
    def pair_at(rotations: float) -> float:
        turns = s.original_context / (rotations * 2 * math.pi)
        return dim * math.log(turns) / (2 * math.log(theta))

    low, high = pair_at(s.beta_fast), pair_at(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    span = max(high - low, 0.001)
    out = []
    for i, f in enumerate(freqs):
        keep = 1.0 - min(max((i - low) / span, 0.0), 1.0)
        out.append(f / s.factor * (1.0 - keep) + f * keep)
    return out


def check_weights(weights: dict[str, Any], config: ModelConfig, source: object) -> None:
    """Raise ModelLoadError naming `source` when a tensor the forward needs is absent."""
    needed = ["embed", "norm"]
    if config.per_layer_dim:
        needed += ["ple_embed", "ple_model_proj", "ple_proj_norm"]
    for i, spec in enumerate(config.layer_specs()):
        needed += [f"layers.{i}.{n}" for n in _layer_weights(config, spec)]
    missing = [n for n in needed if n not in weights]
    if missing:
        raise ModelLoadError(
            f"{source}: {len(missing)} tensors are missing (first: {missing[0]}); the file is "
            "incomplete or not a Llama-style model"
        )


def _layer_weights(config: ModelConfig, spec: LayerSpec) -> list[str]:
    """The canonical names of the weights one layer's plan reads."""
    own_kv = [] if spec.kv_source is not None else ["wk"] if spec.k_as_v else ["wk", "wv"]
    names = ["wq", *own_kv, "wo"] + (["wq_gate"] if spec.attn_gate else [])
    if spec.mixer == "recurrent":
        names = list(RECURRENT_WEIGHTS)
    if spec.shared_expert:
        names += list(SHARED_EXPERT_WEIGHTS)
    if spec.mlp != "dense":
        parts = ("w_gate", "w_up", "w_down")
        experts = range(config.n_experts)
        names += ["router"] + [f"experts.{e}.{n}" for e in experts for n in parts]
    if spec.mlp != "moe":
        names += ["w_gate", "w_up", "w_down"]
    if spec.mlp == "dense+moe":
        names += ["moe_norm", "post_mlp_norm_1", "post_moe_norm"]
    if spec.router == "scaled":
        names += ["router_scale", "expert_scale"]
    if spec.pre_norms:
        names += ["attn_norm", "mlp_norm"]
    if spec.post_norms:
        names += ["post_attn_norm", "post_mlp_norm"]
    if spec.qk_norm != "none":
        names += ["q_norm"] + (["k_norm"] if spec.kv_source is None else [])
    if spec.per_layer_input:
        names += ["ple_gate", "ple_proj", "ple_norm"]
    if spec.sinks:
        names += ["sinks"]
    return names
