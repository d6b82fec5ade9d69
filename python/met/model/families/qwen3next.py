"""Qwen3-Next and Qwen3-Coder-Next (`qwen3next` in GGUF, `qwen3_next` in HF): the hybrid layers
of families/qwen3_hybrid.py with the DeltaNet's q, k, v, z projections fused per key head
(in_proj_qkvz; b and a as in_proj_ba), MoE MLPs with a gated shared expert."""

from met.model.families.qwen3_hybrid import hybrid_family

FAMILY = hybrid_family("qwen3next", ("qwen3_next",), text_prefixes=())
