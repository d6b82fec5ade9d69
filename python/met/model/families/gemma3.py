"""Gemma 3: Gemma 2's layers with per-head Q/K norms instead of soft-capped scores, five sliding
layers (with their own RoPE base) to each global one; multimodal folders hold the text model under
a prefix."""

from met.model.families.gemma import (
    HF_LAYER_NORMS,
    HF_TEXT_PREFIXES,
    apply_gemma_gguf,
    apply_gemma_hf,
    fold_hf_norms,
)
from met.model.families.spec import Family

FAMILY = Family(
    name="gemma3",
    gguf_archs=("gemma3",),
    hf_types=("gemma3", "gemma3_text"),
    gguf_config=apply_gemma_gguf,
    hf_config=apply_gemma_hf,
    hf_names=HF_LAYER_NORMS,
    hf_text_prefixes=HF_TEXT_PREFIXES,
    hf_weights=fold_hf_norms,
    turn_end_tokens=("<end_of_turn>",),
)
