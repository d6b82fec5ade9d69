"""Qwen3.5 / Qwen3.6 dense (`qwen35` in GGUF; `qwen3_5`, and its text model `qwen3_5_text`, in
HF): three Gated DeltaNet layers then one gated attention layer, dense SiLU MLPs (the layers as
families/qwen3_hybrid.py reads them). The vision tower of a multimodal checkpoint is not read."""

from met.model.families.qwen3_hybrid import hybrid_family

FAMILY = hybrid_family("qwen35", ("qwen3_5", "qwen3_5_text"))
