"""Qwen3-Next and Qwen3-Coder-Next (`qwen3next` in GGUF, `qwen3_next` in HF): the hybrid layers
of families/qwen3_hybrid.py with the DeltaNet's q, k, v, z projections fused per key head
(in_proj_qkvz; b and a as in_proj_ba), MoE MLPs with a gated shared expert."""

from met.model.families import qwen3_hybrid as hybrid
from met.model.families.spec import Family

FAMILY = Family(
    name="qwen3next",
    gguf_archs=("qwen3next",),
    hf_types=("qwen3_next",),
    gguf_config=hybrid.apply_gguf,
    hf_config=hybrid.apply_hf,
    hf_names=hybrid.HF_NAMES,
    gguf_names=hybrid.GGUF_NAMES,
    load_weights=hybrid.load_weights,
)
