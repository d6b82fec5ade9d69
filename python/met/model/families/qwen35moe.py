"""Qwen3.5 / Qwen3.6 MoE (`qwen35moe` in GGUF; `qwen3_5_moe`, and its text model
`qwen3_5_moe_text`, in HF): Qwen3.5's hybrid layers, every MLP softmax-routed experts plus a
sigmoid-gated shared expert (families/qwen3_hybrid.py)."""

from met.model.families import qwen3_hybrid as hybrid
from met.model.families.spec import Family

FAMILY = Family(
    name="qwen35moe",
    gguf_archs=("qwen35moe",),
    hf_types=("qwen3_5_moe", "qwen3_5_moe_text"),
    gguf_config=hybrid.apply_gguf,
    hf_config=hybrid.apply_hf,
    hf_names=hybrid.HF_NAMES,
    gguf_names=hybrid.GGUF_NAMES,
    hf_text_prefixes=hybrid.HF_TEXT_PREFIXES,
    load_weights=hybrid.load_weights,
)
