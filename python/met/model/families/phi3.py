"""Phi-3: fused QKV and gate/up projections (split by met.model.fused) and LongRoPE (read by
the loaders from rope_scaling and the rope_factors tensors)."""

from met.model.families.spec import Family

FAMILY = Family(name="phi3", gguf_archs=("phi3",), hf_types=("phi3",))
