"""What a family module declares: the per-layer plan the forwards execute (LayerSpec) and how the
family is read from GGUF files and Hugging Face folders (Family)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from met.model.config import ModelConfig

MIXERS = ("attention", "recurrent")  # recurrent: a Gated DeltaNet layer (model/deltanet.py)
ROPES = ("global", "local", "none")  # local: the sliding layers' own base (Gemma 3)
QK_NORMS = ("none", "head", "full")  # head: per head (Qwen3); full: whole projection (OLMo 2)
NORMS = ("pre", "sandwich", "post")  # sandwich: pre and post (Gemma); post: post only (OLMo 2)
MLPS = ("dense", "moe", "dense+moe")  # dense+moe: both in parallel, summed (Gemma 4's MoE)
# softmax: over all E router logits, then the top k (Qwen3-MoE, Mixtral); topk_softmax: the top k
# logits, then a softmax over those (gpt-oss; equal to softmax when renormalised); scaled (Gemma
# 4): softmax routing of the residual, RMS-normalized and scaled by a learned vector /
# sqrt(hidden), and per-expert output scales.
ROUTERS = ("softmax", "topk_softmax", "scaled")


@dataclass(frozen=True)
class LayerSpec:
    """What one decoder layer is. The forwards read these, never the family's name."""

    mixer: str = "attention"
    window: int | None = None  # sliding attention: a query at p sees keys p - window + 1 .. p
    rope: str = "global"
    qk_norm: str = "none"
    norms: str = "pre"
    mlp: str = "dense"
    router: str = "softmax"
    # Attention sinks (gpt-oss): a learned logit per query head in the softmax denominator, with
    # no value: the layer's weights hold it as `sinks` [n_heads].
    sinks: bool = False
    # Gemma 4: a layer's own head width and KV head count (None: the config's); the earlier
    # layer whose K/V it attends over instead of projecting its own (shared KV: it has no K/V
    # projection and no pages in the pool); V taken from the K projection, V RMS-normalized
    # without a weight; a per-layer embedding input added after the MLP.
    head_dim: int | None = None
    n_kv_heads: int | None = None
    kv_source: int | None = None
    k_as_v: bool = False
    v_norm: bool = False
    per_layer_input: bool = False
    attn_gate: bool = False  # attention output times sigmoid(a per-channel gate from the input)
    shared_expert: bool = False  # MoE: plus a sigmoid-gated shared expert (Qwen3-Next)

    def __post_init__(self) -> None:
        for value, allowed in (
            (self.mixer, MIXERS),
            (self.rope, ROPES),
            (self.qk_norm, QK_NORMS),
            (self.norms, NORMS),
            (self.mlp, MLPS),
            (self.router, ROUTERS),
        ):
            if value not in allowed:
                raise ValueError(f"LayerSpec: {value!r} is not one of {', '.join(allowed)}")

    @property
    def own_kv(self) -> bool:
        return self.kv_source is None

    @property
    def pre_norms(self) -> bool:
        return self.norms != "post"

    @property
    def post_norms(self) -> bool:
        return self.norms != "pre"


def standard_layers(config: ModelConfig) -> list[LayerSpec]:
    """The plan the config's model-wide settings describe: every layer attends (sliding where
    sliding_layers says so, or all when only sliding_window is set), rotates with the global
    base (a sliding layer with the local one where there is one), per-head Q/K norms with
    qk_norm, sandwich norms with post_norms, MoE MLPs with experts."""
    specs = []
    for i in range(config.n_layers):
        sliding = config.sliding_layers is None or config.sliding_layers[i]
        local = config.rope_local_theta is not None and sliding
        specs.append(
            LayerSpec(
                window=config.sliding_window if sliding else None,
                rope="local" if local else "global",
                qk_norm="head" if config.qk_norm else "none",
                norms="sandwich" if config.post_norms else "pre",
                mlp="moe" if config.n_experts else "dense",
            )
        )
    return specs


def rope_settings(raw: dict[str, Any]) -> dict[str, Any]:
    """A config.json's rope_scaling, or rope_parameters as transformers 5 writes it (with
    rope_theta inside)."""
    return raw.get("rope_scaling") or raw.get("rope_parameters") or {}


def yarn_magnitude(rope: dict[str, Any]) -> float:
    """The cos/sin magnitude transformers derives for a YaRN rope_parameters dict (its
    attention_factor, else from factor, mscale and mscale_all_dim)."""
    if rope.get("attention_factor") is not None:
        return float(rope["attention_factor"])
    factor = float(rope.get("factor") or 1.0)

    def mscale(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if rope.get("mscale") and rope.get("mscale_all_dim"):
        return mscale(float(rope["mscale"])) / mscale(float(rope["mscale_all_dim"]))
    return mscale(1.0)


GgufGet = Callable[[str, Any], Any]  # get(key, default) over a file's `{arch}.` metadata


def _unchanged(*_: object) -> None:
    return None


@dataclass(frozen=True)
class Family:
    """One model family: the names it is stored under, how its config and weights are read in
    both formats and its layer plan.

    gguf_config(config, get) and hf_config(config, raw) complete a config the loaders filled with
    the fields every family shares; hf_weights(weights) adjusts the canonical weights of a
    folder (Gemma's (1 + w) norms), load_weights(weights, config, fmt) those of either format
    ("gguf" or "hf": splitting fused projections, undoing a converter's reordering). hf_names
    maps a Hugging Face layer tensor suffix (or a whole global tensor name) to its canonical
    name, over the common ones (hf_loader._LAYER_NAMES)."""

    name: str
    gguf_archs: tuple[str, ...] = ()
    hf_types: tuple[str, ...] = ()
    gguf_permuted: bool = False  # llama.cpp's converter interleaves Q/K rows (NORM RoPE archs)
    gguf_config: Callable[[ModelConfig, GgufGet], None] = _unchanged
    # What the plan takes from a GGUF file's tensor names (Gemma 4: layers without attn_v).
    gguf_tensors: Callable[[ModelConfig, set[str]], None] = _unchanged
    hf_config: Callable[[ModelConfig, dict[str, Any]], None] = _unchanged
    layers: Callable[[ModelConfig], list[LayerSpec]] = standard_layers
    hf_names: Mapping[str, str] = field(default_factory=dict)
    # GGUF tensor name (global) or layer tensor suffix -> canonical name, over the common ones
    # (gguf_loader._GLOBAL_NAMES, _LAYER_NAMES).
    gguf_names: Mapping[str, str] = field(default_factory=dict)
    load_weights: Callable[[dict[str, Tensor], ModelConfig, str], None] = _unchanged
    hf_text_prefixes: tuple[str, ...] = ()  # multimodal checkpoints: where the text model is
    hf_weights: Callable[[dict[str, Tensor]], None] = _unchanged
    turn_end_tokens: tuple[str, ...] = ()  # also end generation (Gemma's <end_of_turn>)
    # Never end generation, even where a file names them (gpt-oss's <|end|>, between the
    # messages of one harmony turn: llama.cpp drops it from its end-of-generation set too).
    not_end_tokens: tuple[str, ...] = ()
