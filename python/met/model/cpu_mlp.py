"""A layer's MLP as the C++ CPU forward takes it (met.model.cpu_llama): dense, routed experts
(with gpt-oss's biases), or Gemma 4's dense MLP and experts side by side with their scaled
router; the experts' width beside the dense MLPs' (LlamaDims); and how weights and float32
tensors cross into the forward (blocks and addresses)."""

from __future__ import annotations

import torch
from torch import Tensor

from met import _core
from met.kernels.cpu_quant import QuantLinear
from met.model.linear import RowParts
from met.model.llama import LlamaModel
from met.model.moe import MoeBlock

# Gemma 4's norms around the two MLPs of a dense+moe layer (model/layer_extras.py).
_DENSE_AND_MOE_NORMS = ("moe_norm", "post_mlp_norm_1", "post_moe_norm")


def address(t: Tensor | None) -> int:
    """A float32 tensor the C++ forward reads in place (0: none)."""
    if t is None:
        return 0
    if t.dtype != torch.float32 or not t.is_contiguous():
        raise ValueError("the C++ forward takes contiguous float32 norms, biases and tables")
    return t.data_ptr()


def weight(w: QuantLinear) -> _core.cpu.QuantWeight:
    return _core.cpu.QuantWeight(w.blocks.data_ptr(), w.qtype, w.out_features, w.in_features)


def whole(w: QuantLinear | RowParts) -> tuple[_core.cpu.QuantWeight, list[_core.cpu.QuantWeight]]:
    """A fused projection as the C++ forward takes it: the weight, or its shape and its parts."""
    if isinstance(w, QuantLinear):
        return weight(w), []
    first = w.parts[0]
    shape = _core.cpu.QuantWeight(
        first.blocks.data_ptr(), first.qtype, w.out_features, w.in_features
    )
    return shape, [weight(p) for p in w.parts]


def mlp_widths(model: LlamaModel) -> tuple[int, int]:
    """(the dense MLPs' width, the experts' or 0): a MoE config's ffn is its experts' width,
    which Gemma 4's dense MLPs beside them do not share."""
    c = model.config
    dense = next((layer["w_down"].in_features for layer in model.layers if "w_down" in layer), None)
    return dense or c.ffn, c.ffn if c.n_experts else 0


def set_mlp(layer: dict, out: _core.cpu.LayerWeights) -> _core.cpu.LayerWeights:
    """A layer's MLP into `out`: dense, its routed experts, or both (a shared expert beside them
    is CpuLlama's to add)."""
    moe: MoeBlock | None = layer.get("moe")
    if "w_gate_up" in layer:
        out.mlp = _core.cpu.Mlp.dense
        out.w_gate_up, out.w_gate_up_parts = whole(layer["w_gate_up"])
        out.w_down = weight(layer["w_down"])
    if moe is None:
        return out
    out.mlp = _core.cpu.Mlp.dense_and_moe if "w_gate_up" in layer else _core.cpu.Mlp.moe
    if "w_gate_up" in layer:
        for name in _DENSE_AND_MOE_NORMS:
            setattr(out, name, address(layer[name]))
    _experts(moe, out)
    return out


def _experts(moe: MoeBlock, out: _core.cpu.LayerWeights) -> None:
    """The float32 router, its scales, and every expert's pair of weights (in expert order) and
    biases."""
    out.router, out.router_bias = address(moe.router), address(moe.router_bias)
    if moe.scaled is not None:  # Gemma 4
        out.router_scale = address(moe.scaled.scale)
        out.expert_scale = address(moe.scaled.expert_scale)
    experts = [moe.experts[e] for e in range(moe.n_experts)]
    out.expert_gate_up = [weight(gate_up) for gate_up, _ in experts]
    out.expert_down = [weight(down) for _, down in experts]
    if moe.biases:  # gpt-oss: every expert's gate/up and down biases
        biases = [moe.biases[e] for e in range(moe.n_experts)]
        out.expert_b_gate_up = [address(gate_up) for gate_up, _ in biases]
        out.expert_b_down = [address(down) for _, down in biases]
