"""Qwen3.5 / Qwen3.6 MoE (`qwen35moe` in GGUF; `qwen3_5_moe`, and its text model
`qwen3_5_moe_text`, in HF): Qwen3.5's hybrid layers, every MLP softmax-routed experts plus a
sigmoid-gated shared expert (families/qwen3_hybrid.py)."""

from met.model.families.qwen3_hybrid import hybrid_family

FAMILY = hybrid_family("qwen35moe", ("qwen3_5_moe", "qwen3_5_moe_text"))
