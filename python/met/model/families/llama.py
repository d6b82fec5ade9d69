"""Llama (1-3.x): pre-norm attention and SiLU-gated MLP. GGUF `llama` files also hold Mistral and
Mixtral models (a `llama` file with expert_count is a MoE); their Q/K rows are permuted."""

from met.model.families.spec import Family

FAMILY = Family(name="llama", gguf_archs=("llama",), hf_types=("llama",), gguf_permuted=True)
