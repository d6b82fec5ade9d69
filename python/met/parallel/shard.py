"""Megatron-style tensor-parallel slices of a dense Llama's weights, one per rank.

Rank r of N keeps attention heads [r*nh/N, (r+1)*nh/N) and KV heads [r*nkv/N, (r+1)*nkv/N):
rows of wq/wk/wv (and their biases), the matching columns of wo. Contiguous slices keep every
query head with its KV head, since each rank holds whole GQA groups. The MLP keeps rows
[r*F/N, (r+1)*F/N) of w_gate and w_up and the same columns of w_down. Each rank's wo and w_down
outputs are partial sums that the model's `reduce` hook all-reduces. Embedding, norms and the
LM head are replicated: every rank can embed its own input, and rank 0 holds whole logits to
sample from without a gather.

A mixture-of-experts model's router is replicated too. Under plain tensor parallelism each
expert is sliced like a dense MLP (1/N of its width on every rank); with expert_parallel each
rank instead keeps E/N whole experts (met.parallel.experts) and the attention split is unchanged.
Either way a rank's MoE output is a partial sum, all-reduced by the same hook.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from met.model.config import ModelConfig
from met.model.families.spec import LayerSpec
from met.model.moe import expert_of, keep_experts
from met.parallel.experts import check_expert_split

_ROW_SLICED = {"wq": "q", "bq": "q", "wk": "kv", "bk": "kv", "wv": "kv", "bv": "kv"}
_COL_SLICED = {"wo": "q", "w_down": "ffn"}
_FFN_ROWS = ("w_gate", "w_up")


class ShardError(ValueError):
    """The model cannot be divided over the requested number of ranks."""


def check_divisible(config: ModelConfig, world: int, expert_parallel: bool = False) -> None:
    """Raise ShardError naming the dimension that does not split evenly over `world` ranks
    (ExpertSplitError, a ValueError too, for the experts under expert_parallel)."""
    if world > 1 and any(spec.sinks for spec in config.layer_specs()):
        raise ShardError(
            "tensor parallel: attention sinks and biased experts (gpt-oss) are not split over "
            "ranks; serve this model on one rank"
        )
    if world > 1 and any(_own_shapes(s) for s in config.layer_specs()):
        raise ShardError(
            "tensor parallel: layers with their own head widths, per-layer embeddings or a dense "
            "MLP beside the experts (Gemma 4) are not split over ranks yet; run it on one"
        )
    if expert_parallel:
        check_expert_split(config, world)
    if config.n_heads % world or config.n_kv_heads % world:
        raise ShardError(
            f"tensor parallel: cannot split {config.n_heads} attention heads / "
            f"{config.n_kv_heads} KV heads over {world} ranks; both must be multiples of the "
            f"tensor-parallel size (this model allows {_valid_sizes(config, expert_parallel)})"
        )
    if not expert_parallel and config.ffn % world:
        if config.n_experts:
            raise ShardError(
                f"tensor parallel: cannot split the experts' MLP width {config.ffn} over "
                f"{world} ranks; --enable-expert-parallel splits whole experts instead"
            )
        raise ShardError(
            f"tensor parallel: cannot split the MLP width {config.ffn} over {world} ranks"
        )


def _own_shapes(spec: LayerSpec) -> bool:
    return bool(spec.head_dim or spec.n_kv_heads or spec.per_layer_input) or spec.mlp == "dense+moe"


def _valid_sizes(config: ModelConfig, expert_parallel: bool) -> str:
    # Under expert parallelism the expert width stays whole; the expert count must divide.
    split = config.n_experts if expert_parallel else config.ffn
    sizes = [
        n
        for n in range(1, config.n_kv_heads + 1)
        if config.n_heads % n == 0 and config.n_kv_heads % n == 0 and split % n == 0
    ]
    return ", ".join(str(n) for n in sizes)


def shard_config(config: ModelConfig, world: int, expert_parallel: bool = False) -> ModelConfig:
    """The per-rank config: the forward then sees only its own heads and MLP width (a whole
    expert's width under expert_parallel, where a rank holds fewer experts instead)."""
    check_divisible(config, world, expert_parallel)
    return replace(
        config,
        n_heads=config.n_heads // world,
        n_kv_heads=config.n_kv_heads // world,
        ffn=config.ffn if expert_parallel else config.ffn // world,
    )


def shard_weights(
    config: ModelConfig,
    weights: dict[str, Tensor],
    rank: int,
    world: int,
    expert_parallel: bool = False,
) -> tuple[ModelConfig, dict[str, Tensor]]:
    """This rank's config and weights; consumes `weights` (slices are copied, so the whole
    tensors can be freed)."""
    local = shard_config(config, world, expert_parallel)
    if expert_parallel:
        keep_experts(weights, config.n_experts, rank, world)
    widths = {
        "q": local.n_heads * config.head_dim,
        "kv": local.n_kv_heads * config.head_dim,
        "ffn": local.ffn,
    }
    out: dict[str, Tensor] = {}
    for name in list(weights):
        tensor = weights.pop(name)
        short = name.rsplit(".", 1)[-1]
        if expert_parallel and expert_of(name) is not None:
            # A whole expert; copied, since a GGUF expert is a view of all experts' tensor.
            tensor = _own(tensor)
        elif short in _ROW_SLICED or short in _FFN_ROWS:
            width = widths[_ROW_SLICED.get(short, "ffn")]
            tensor = _own(tensor[rank * width : (rank + 1) * width])
        elif short in _COL_SLICED:
            width = widths[_COL_SLICED[short]]
            tensor = _own(tensor[:, rank * width : (rank + 1) * width])
        out[name] = tensor
    return local, out


def _own(view: Tensor) -> Tensor:
    # A view would keep the whole tensor's storage alive on every rank.
    return view.clone(memory_format=torch.contiguous_format)
