"""Gemma 2: sandwich norms, GeLU(tanh), scaled embeddings, soft-capped attention scores and
logits, sliding and global layers alternating (met.model.families.gemma reads them)."""

from met.model.families.gemma import (
    HF_LAYER_NORMS,
    HF_TEXT_PREFIXES,
    apply_gemma_gguf,
    apply_gemma_hf,
    fold_hf_norms,
)
from met.model.families.spec import Family

FAMILY = Family(
    name="gemma2",
    gguf_archs=("gemma2",),
    hf_types=("gemma2",),
    gguf_config=apply_gemma_gguf,
    hf_config=apply_gemma_hf,
    hf_names=HF_LAYER_NORMS,
    hf_text_prefixes=HF_TEXT_PREFIXES,
    hf_weights=fold_hf_norms,
    turn_end_tokens=("<end_of_turn>",),
)
