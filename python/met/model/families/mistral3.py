"""Ministral 3 / Mistral Small 3 (`mistral3` in GGUF; `ministral3`, and the multimodal `mistral3`
wrapping it, in HF): Mistral's layers with YaRN RoPE and a Llama 4-style query temperature, the
queries at position p scaled after RoPE by 1 + beta * ln(1 + floor(p / original context)).

HF: beta is rope_parameters' llama_4_scaling_beta, YaRN's cos/sin magnitude the attention_factor
transformers derives (from mscale and mscale_all_dim). GGUF: beta is attention.temperature_scale,
its length rope.scaling.original_context_length, and the magnitude 1: llama.cpp's mistral3 graph
passes the reciprocal of YaRN's own factor, cancelling it. llama.cpp rotates mistral3 as llama
(NORM RoPE), so the converter permutes Q/K rows. The vision tower of a multimodal checkpoint is
not read."""

from typing import Any

from met.model.config import ModelConfig
from met.model.families.spec import Family, GgufGet, rope_settings, yarn_magnitude

# Where transformers keeps the text model of Mistral3ForConditionalGeneration (new and old).
_TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.")


def _hf_config(config: ModelConfig, raw: dict[str, Any]) -> None:
    rope = rope_settings(raw)
    if (rope.get("rope_type") or rope.get("type")) == "yarn":
        config.rope_attn_factor = yarn_magnitude(rope)
    beta = rope.get("llama_4_scaling_beta")
    if beta:
        config.attn_temp_scale = float(beta)
        config.attn_temp_length = int(rope["original_max_position_embeddings"])


def _gguf_config(config: ModelConfig, get: GgufGet) -> None:
    config.rope_attn_factor = 1.0
    beta = get("attention.temperature_scale", None)
    if beta:
        config.attn_temp_scale = float(beta)
        config.attn_temp_length = int(get("rope.scaling.original_context_length", 0))


FAMILY = Family(
    name="mistral3",
    gguf_archs=("mistral3",),
    hf_types=("mistral3", "ministral3"),
    gguf_permuted=True,
    gguf_config=_gguf_config,
    hf_config=_hf_config,
    hf_text_prefixes=_TEXT_PREFIXES,
)
