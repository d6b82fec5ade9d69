"""The parts of a layer plan beyond the Llama layer that LlamaModel executes (Gemma 4's): per-head
Q/K norm scales of a layer's own width, the per-layer flags and norms, and per-layer embeddings.

Per-layer embeddings (PLE, transformers' Gemma4TextModel.get_per_layer_inputs and
project_per_layer_inputs; llama.cpp's build_inp_per_layer and project_per_layer_inputs): each
token gets, for every layer l, a D-wide input: its row of a [V, L*D] table times sqrt(D), plus the
embedded token projected to [L*D], scaled by 1/sqrt(hidden) and RMS-normalized per layer slice,
the sum times 1/sqrt(2). After its MLP, layer l adds to the residual
norm(proj(gelu_tanh(gate(x)) * input_l)).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from met.model.config import ModelConfig
from met.model.families.spec import LayerSpec
from met.model.linear import Weight, embedding, linear

Norm = Callable[[Tensor, Tensor], Tensor]


def head_norms(q_norm: Tensor, k_norm: Tensor | None, dims: tuple[int, int, int]) -> Tensor:
    """Per-head Q and K norms as one [n_heads + n_kv_heads, head_dim] scale, so the Q/K tensor
    is normalized per head in one op; a shared-KV layer (no K of its own) has Q's only."""
    n_heads, n_kv, _ = dims
    norms = [q_norm.expand(n_heads, -1)]
    if k_norm is not None:
        norms.append(k_norm.expand(n_kv, -1))
    return torch.cat(norms).contiguous()


def own_values(
    qkv: Tensor, w: dict[str, Weight | bool], q_width: int, kv_width: int, eps: float
) -> Tensor:
    """A layer's V [T, n_kv, head_dim] from its fused projection: V's own rows, or (K as V) the
    K rows as they came out, RMS-normalized without a weight where the plan says."""
    _, n_kv, head_dim = w["dims"]
    start = q_width if w["k_as_v"] else q_width + kv_width
    v = qkv[:, start : start + kv_width].view(qkv.shape[0], n_kv, head_dim)
    return F.rms_norm(v, (head_dim,), eps=eps) if w["v_norm"] else v


def take_layer_extras(
    weights: dict[str, Weight], i: int, spec: LayerSpec, take: Callable[[str], Weight]
) -> dict[str, Weight | bool]:
    """Layer i's entries beyond the Llama layer's: its V flags, the norms of a dense+moe MLP,
    its per-layer-embedding weights and its output scale, as the plan and weights have them."""
    p = f"layers.{i}."
    out: dict[str, Weight | bool] = {"k_as_v": spec.k_as_v, "v_norm": spec.v_norm}
    if spec.mlp == "dense+moe":
        out |= {n: take(p + n) for n in ("moe_norm", "post_mlp_norm_1", "post_moe_norm")}
    if spec.per_layer_input:
        out |= {n: take(p + n) for n in ("ple_gate", "ple_proj", "ple_norm")}
    if p + "out_scale" in weights:  # optional in llama.cpp's files; 1 where absent
        out["out_scale"] = take(p + "out_scale").reshape(())
    return out


class PerLayerInputs:
    """The model-wide per-layer-embedding tables and the two steps that use them."""

    def __init__(self, config: ModelConfig, embed: Weight, model_proj: Weight, norm: Tensor):
        self.n_layers, self.dim = config.n_layers, config.per_layer_dim
        self.embed, self.model_proj, self.norm = embed, model_proj, norm
        # As both implementations compute them: sqrt(D) rounded to float32, 1/sqrt(hidden).
        self.embed_scale = float(torch.tensor(math.sqrt(self.dim), dtype=torch.float32))
        self.proj_scale = config.hidden**-0.5

    def inputs(self, ids: Tensor, x: Tensor, norm: Norm) -> Tensor:
        """[T, n_layers, D] per-layer inputs of tokens `ids` whose scaled embeddings are x."""
        shape = (x.shape[0], self.n_layers, self.dim)
        tokens = (embedding(ids, self.embed) * self.embed_scale).view(shape)
        projected = norm((linear(x, self.model_proj) * self.proj_scale).view(shape), self.norm)
        return (projected + tokens) * 2**-0.5

    @staticmethod
    def add(x: Tensor, per_layer: Tensor, w: dict[str, Weight], norm: Norm) -> Tensor:
        """The residual x after a layer's per-layer-embedding step, per_layer [T, D] its input."""
        gated = F.gelu(linear(x, w["ple_gate"]), approximate="tanh") * per_layer
        return x + norm(linear(gated, w["ple_proj"]), w["ple_norm"])


def take_per_layer_inputs(config: ModelConfig, take: Callable[[str], Weight]) -> PerLayerInputs:
    return PerLayerInputs(config, take("ple_embed"), take("ple_model_proj"), take("ple_proj_norm"))
