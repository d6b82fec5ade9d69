"""Fused projections some families store (Phi-3: one QKV matrix, one gate+up matrix), split into
the canonical per-projection weights the forward fuses again its own way."""

from __future__ import annotations

from met.kernels.cpu_quant import QuantLinear
from met.model.config import ModelConfig, ModelLoadError
from met.model.linear import Weight

# Canonical names of the fused tensors the loaders produce, per layer.
FUSED_QKV = "wqkv_fused"
FUSED_GATE_UP = "w_gate_up_fused"


def _rows(weight: Weight, start: int, stop: int) -> Weight:
    if isinstance(weight, QuantLinear):
        # A GGUF row holds whole blocks along K, so a row range is exact on the bytes.
        return QuantLinear(
            weight.blocks[start:stop].clone(), weight.qtype, stop - start, weight.in_features
        )
    return weight[start:stop].clone()


def _n_rows(weight: Weight) -> int:
    return weight.out_features if isinstance(weight, QuantLinear) else weight.shape[0]


def split_fused(weights: dict[str, Weight], config: ModelConfig, source: object) -> None:
    """Replaces each layer's fused QKV / gate-up tensor by its parts, in place."""
    q, kv = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    for i in range(config.n_layers):
        p = f"layers.{i}."
        fused = weights.pop(p + FUSED_QKV, None)
        if fused is not None:
            _check(fused, q + 2 * kv, p + FUSED_QKV, source)
            weights[p + "wq"] = _rows(fused, 0, q)
            weights[p + "wk"] = _rows(fused, q, q + kv)
            weights[p + "wv"] = _rows(fused, q + kv, q + 2 * kv)
        fused = weights.pop(p + FUSED_GATE_UP, None)
        if fused is None and p + "w_gate" not in weights and p + "w_up" in weights:
            # GGUF keeps Phi-3's gate/up as one ffn_up of twice the height, gate rows first.
            fused = weights.pop(p + "w_up") if _n_rows(weights[p + "w_up"]) > config.ffn else None
        if fused is not None:
            _check(fused, 2 * config.ffn, p + FUSED_GATE_UP, source)
            weights[p + "w_gate"] = _rows(fused, 0, config.ffn)
            weights[p + "w_up"] = _rows(fused, config.ffn, 2 * config.ffn)


def _check(weight: Weight, rows: int, name: str, source: object) -> None:
    if _n_rows(weight) != rows:
        raise ModelLoadError(
            f"{source}: {name} has {_n_rows(weight)} rows, expected {rows}; the file's shapes "
            "are inconsistent"
        )


def split_expert_gate_up(weights: dict[str, Weight]) -> None:
    """Replaces each expert's fused gate+up weight (`experts.{e}.w_gate_up`, gate rows first:
    llama.cpp's ffn_gate_up_exps, transformers' experts.gate_up_proj) by its two halves."""
    for name in [n for n in weights if n.endswith(".w_gate_up")]:
        fused = weights.pop(name)
        half = _n_rows(fused) // 2
        stem = name.removesuffix("w_gate_up")
        weights[stem + "w_gate"] = _rows(fused, 0, half)
        weights[stem + "w_up"] = _rows(fused, half, 2 * half)
