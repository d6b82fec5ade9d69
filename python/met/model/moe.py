"""A sparse mixture-of-experts MLP (Qwen3-MoE, Mixtral): a router picks top-k experts per token.

Interface (what a layer of LlamaModel holds instead of its dense gate/up/down):
    block = MoeBlock(router [E, H], {e: (w_gate_up [2F, H], w_down [H, F])}, top_k, norm_topk)
    y = block(x)  # x [T, H] -> y [T, H]

Routing (Hugging Face's Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock): softmax over all E
router logits in float32, the k largest probabilities, divided by their sum when norm_topk (always
for Mixtral, per `norm_topk_prob` for Qwen3-MoE). Mixtral's "softmax over the top-k logits" is
the same numbers: exp(l_i) / sum_topk exp(l_j) = p_i / sum_topk p_j. gpt-oss (router kind
"topk_softmax") computes it that way: its router has a bias, its experts biases on gate/up and
down, and its own gated activation (the clamped SwiGLU), which the block takes as `activation`.
Gemma 4 (router kind "scaled") routes the residual stream, RMS-normalized and scaled, while its
experts read their own normalized input, and scales each chosen expert's weight (ScaledRouter).

Batched: the T * k (token, expert) pairs are sorted by expert, and each expert with tokens runs
one matmul over the rows routed to it; the outputs are scaled by their routing weights and
scatter-added back to their tokens. There is no loop over tokens.

Expert parallel: `experts` may hold only some of the E expert ids (keep_experts below picks a
rank's share of the canonical weights). Tokens routed to an absent expert contribute nothing
here, so each rank's output is a partial sum over its experts; the model's `reduce` hook (the
same all-reduce tensor parallel uses for wo and w_down) adds the ranks' partials into the full
output. The router is replicated, so every rank makes the same routing decisions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from met.model.config import ModelConfig
from met.model.linear import Weight, linear

ExpertWeights = tuple[Weight, Weight]  # (w_gate_up [2F, H]: gate rows then up rows, w_down)
ExpertBiases = tuple[Tensor, Tensor]  # (b_gate_up [2F], b_down [H])
Activation = Callable[[Tensor, Tensor], Tensor]  # (gate, up) -> the down projection's input


@dataclass(frozen=True)
class ScaledRouter:
    """Gemma 4's router: it reads its input RMS-normalized (no weight) times `scale` ([H], the
    learned scale over sqrt(hidden)); each chosen expert's weight is then multiplied by its
    `expert_scale` [E] (after the top-k renormalization)."""

    scale: Tensor
    expert_scale: Tensor
    eps: float


def silu_gated(gate: Tensor, up: Tensor) -> Tensor:
    return F.silu(gate) * up


def clamped_swiglu(gate: Tensor, up: Tensor, limit: float, alpha: float) -> Tensor:
    """gpt-oss's experts' activation (transformers' GptOssExperts._apply_gate, ggml's
    swiglu_oai): gate clamped above at limit, up to [-limit, limit], then
    gate * sigmoid(alpha * gate) * (up + 1)."""
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(gate * alpha) * (up + 1)


def route(
    router_logits: Tensor, top_k: int, norm_topk: bool, kind: str = "softmax"
) -> tuple[Tensor, Tensor]:
    """(weights [T, k] float32, expert ids [T, k]) for router logits [T, E]."""
    if kind == "topk_softmax":
        logits, ids = torch.topk(router_logits.float(), top_k, dim=-1)
        return torch.softmax(logits, dim=-1), ids
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


class MoeBlock:
    """The MoE MLP of one layer; `experts` maps expert id -> its weights (all E, or a rank's)."""

    def __init__(
        self,
        router: Weight,
        experts: Mapping[int, ExpertWeights],
        top_k: int,
        norm_topk: bool,
        router_kind: str = "softmax",
        router_bias: Tensor | None = None,
        biases: Mapping[int, ExpertBiases] | None = None,
        activation: Activation = silu_gated,
        scaled: ScaledRouter | None = None,
        shared: tuple[Weight, ExpertWeights] | None = None,
    ) -> None:
        self.router = router
        # Qwen3-Next / Qwen3.5-MoE: (gate [1, H], expert) whose output, times sigmoid(gate . x),
        # every token adds. Under expert parallelism the rank holding expert 0 adds it.
        self.shared = shared
        self.scaled = scaled
        self.router_kind = router_kind
        self.router_bias = router_bias
        self.experts = dict(experts)
        self.biases = dict(biases or {})
        self.activation = activation
        self.n_experts = router.shape[0] if isinstance(router, Tensor) else router.out_features
        self.top_k = top_k
        self.norm_topk = norm_topk
        if not 0 < top_k <= self.n_experts:
            raise ValueError(f"top_k {top_k} must be in 1..{self.n_experts} experts")
        if any(not 0 <= e < self.n_experts for e in self.experts):
            raise ValueError(f"expert ids must be in 0..{self.n_experts - 1}")

    def __call__(self, x: Tensor, router_input: Tensor | None = None) -> Tensor:
        """The experts' output for their input x; router_input: what the router reads, when
        not x (Gemma 4 routes the residual stream, its experts read it normalized)."""
        r = x if router_input is None else router_input
        if self.scaled is not None:
            r = F.rms_norm(r, (r.shape[-1],), eps=self.scaled.eps) * self.scaled.scale
        logits = linear(r, self.router, self.router_bias)
        weights, ids = route(logits, self.top_k, self.norm_topk, self.router_kind)
        if self.scaled is not None:
            weights = weights * self.scaled.expert_scale[ids].float()
        flat_ids = ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)
        # Row j of the sorted pairs belongs to token order[j] // k.
        tokens = order // self.top_k
        pair_weights = weights.reshape(-1)[order].to(x.dtype)
        counts = torch.bincount(flat_ids, minlength=self.n_experts).tolist()
        out = torch.zeros_like(x)
        start = 0
        for expert, count in enumerate(counts):
            end = start + count
            if count and expert in self.experts:
                rows = tokens[start:end]
                y = self._expert_mlp(x[rows], expert)
                out.index_add_(0, rows, y * pair_weights[start:end, None])
            start = end
        if self.shared is not None and 0 in self.experts:
            gate, expert = self.shared
            out = out + torch.sigmoid(linear(x, gate)) * self._mlp(x, expert)
        return out

    def _expert_mlp(self, x: Tensor, expert: int) -> Tensor:
        b_gate_up, b_down = self.biases.get(expert, (None, None))
        return self._mlp(x, self.experts[expert], b_gate_up, b_down)

    def _mlp(
        self,
        x: Tensor,
        weights: ExpertWeights,
        b_gate_up: Tensor | None = None,
        b_down: Tensor | None = None,
    ) -> Tensor:
        gate_up, down = weights
        gate, up = linear(x, gate_up, b_gate_up).chunk(2, dim=-1)
        return linear(self.activation(gate, up), down, b_down)


def take_moe_block(
    weights: dict[str, Weight],
    layer: int,
    config: ModelConfig,
    take: Callable[[str], Weight],
    fuse: Callable[[list[Weight]], Weight],
    activation: Activation = silu_gated,
) -> MoeBlock:
    """Layer `layer`'s block from the canonical weights present (all experts, or an
    expert-parallel rank's share), each taken through `take` (LlamaModel's: pops the weight and
    moves it to the model's device and dtype), gate and up fused through `fuse`; the router
    kind from the layer's spec, biases where the weights have them."""
    p = f"layers.{layer}."
    ids = sorted({e for n in weights if n.startswith(p) and (e := expert_of(n)) is not None})
    experts = {
        e: (
            fuse([take(expert_name(layer, e, "w_gate")), take(expert_name(layer, e, "w_up"))]),
            take(expert_name(layer, e, "w_down")),
        )
        for e in ids
    }
    biases = {
        e: (
            torch.cat([take(expert_name(layer, e, "b_gate")), take(expert_name(layer, e, "b_up"))]),
            take(expert_name(layer, e, "b_down")),
        )
        for e in ids
        if expert_name(layer, e, "b_gate") in weights
    }
    router_bias = take(p + "b_router") if p + "b_router" in weights else None
    scaled = None
    if config.layer_specs()[layer].router == "scaled":
        # The router's input scale and 1 / sqrt(hidden) as one vector.
        scale = take(p + "router_scale") * config.hidden**-0.5
        scaled = ScaledRouter(scale, take(p + "expert_scale"), config.norm_eps)
    shared = None
    if p + "shexp_gate" in weights:
        parts = [take(p + "shexp." + n) for n in ("w_gate", "w_up", "w_down")]
        shared = (take(p + "shexp_gate"), (fuse(parts[:2]), parts[2]))
    return MoeBlock(
        take(p + "router"),
        experts,
        config.n_experts_used,
        config.moe_norm_topk,
        router_kind=config.layer_specs()[layer].router,
        router_bias=router_bias,
        biases=biases,
        activation=activation,
        scaled=scaled,
        shared=shared,
    )


def expert_name(layer: int, expert: int, part: str) -> str:
    """The canonical weight name of one expert's w_gate / w_up / w_down (model/config.py)."""
    return f"layers.{layer}.experts.{expert}.{part}"


def expert_of(name: str) -> int | None:
    """The expert id in a canonical expert weight name, None for any other weight."""
    parts = name.split(".")
    if len(parts) == 5 and parts[2] == "experts":
        return int(parts[3])
    return None


def owned_experts(n_experts: int, rank: int, world: int) -> range:
    """Rank `rank`'s contiguous share of the expert ids; E must split evenly over the ranks."""
    if n_experts % world:
        raise ValueError(f"expert parallel: cannot split {n_experts} experts over {world} ranks")
    share = n_experts // world
    return range(rank * share, (rank + 1) * share)


def keep_experts(weights: dict[str, Weight], n_experts: int, rank: int, world: int) -> None:
    """Drop, in place, every expert weight that rank `rank` of `world` does not own (the
    expert-parallel split; everything else, the router included, stays whole)."""
    owned = owned_experts(n_experts, rank, world)
    for name in list(weights):
        expert = expert_of(name)
        if expert is not None and expert not in owned:
            del weights[name]
