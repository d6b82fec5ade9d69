"""What a family module declares: the per-layer plan the forwards execute (LayerSpec) and how the
family is read from GGUF files and Hugging Face folders (Family)."""

from __future__ import annotations

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
MLPS = ("dense", "moe")


@dataclass(frozen=True)
class LayerSpec:
    """What one decoder layer is. The forwards read these, never the family's name."""

    mixer: str = "attention"
    window: int | None = None  # sliding attention: a query at p sees keys p - window + 1 .. p
    rope: str = "global"
    qk_norm: str = "none"
    norms: str = "pre"
    mlp: str = "dense"
    attn_gate: bool = False  # attention output times sigmoid(a per-channel gate from the input)
    shared_expert: bool = False  # MoE: plus a sigmoid-gated shared expert (Qwen3-Next)

    def __post_init__(self) -> None:
        for value, allowed in (
            (self.mixer, MIXERS),
            (self.rope, ROPES),
            (self.qk_norm, QK_NORMS),
            (self.norms, NORMS),
            (self.mlp, MLPS),
        ):
            if value not in allowed:
                raise ValueError(f"LayerSpec: {value!r} is not one of {', '.join(allowed)}")

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
    and gguf_names map a layer tensor suffix to its canonical name, over the common ones
    (hf_loader._LAYER_NAMES, gguf_loader._LAYER_NAMES)."""

    name: str
    gguf_archs: tuple[str, ...] = ()
    hf_types: tuple[str, ...] = ()
    gguf_permuted: bool = False  # llama.cpp's converter interleaves Q/K rows (NORM RoPE archs)
    gguf_config: Callable[[ModelConfig, GgufGet], None] = _unchanged
    hf_config: Callable[[ModelConfig, dict[str, Any]], None] = _unchanged
    layers: Callable[[ModelConfig], list[LayerSpec]] = standard_layers
    hf_names: Mapping[str, str] = field(default_factory=dict)
    gguf_names: Mapping[str, str] = field(default_factory=dict)
    load_weights: Callable[[dict[str, Tensor], ModelConfig, str], None] = _unchanged
    hf_text_prefixes: tuple[str, ...] = ()  # multimodal checkpoints: where the text model is
    hf_weights: Callable[[dict[str, Tensor]], None] = _unchanged
    turn_end_tokens: tuple[str, ...] = ()  # also end generation (Gemma's <end_of_turn>)
