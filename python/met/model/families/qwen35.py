"""Qwen3.5 / Qwen3.6 dense (`qwen35` in GGUF; `qwen3_5`, and its text model `qwen3_5_text`, in
HF): three Gated DeltaNet layers then one gated attention layer, dense SiLU MLPs (the layers as
families/qwen3_hybrid.py reads them). The vision tower of a multimodal checkpoint is not read."""

from met.model.families import qwen3_hybrid as hybrid
from met.model.families.spec import Family

FAMILY = Family(
    name="qwen35",
    gguf_archs=("qwen35",),
    hf_types=("qwen3_5", "qwen3_5_text"),
    gguf_config=hybrid.apply_gguf,
    hf_config=hybrid.apply_hf,
    hf_names=hybrid.HF_NAMES,
    gguf_names=hybrid.GGUF_NAMES,
    hf_text_prefixes=hybrid.HF_TEXT_PREFIXES,
    load_weights=hybrid.load_weights,
)
