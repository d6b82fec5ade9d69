"""Megatron-style tensor-parallel slices of a dense Llama's weights, one per rank.

Rank r of N keeps attention heads [r*nh/N, (r+1)*nh/N) and KV heads [r*nkv/N, (r+1)*nkv/N):
rows of wq/wk/wv (and their biases), the matching columns of wo. Contiguous slices keep every
query head with its KV head, since each rank holds whole GQA groups. The MLP keeps rows
[r*F/N, (r+1)*F/N) of w_gate and w_up and the same columns of w_down. Each rank's wo and w_down
outputs are partial sums that the model's `reduce` hook all-reduces. Embedding, norms and the
LM head are replicated: every rank can embed its own input, and rank 0 holds whole logits to
sample from without a gather.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from met.model.config import ModelConfig

_ROW_SLICED = {"wq": "q", "bq": "q", "wk": "kv", "bk": "kv", "wv": "kv", "bv": "kv"}
_COL_SLICED = {"wo": "q", "w_down": "ffn"}
_FFN_ROWS = ("w_gate", "w_up")


class ShardError(ValueError):
    """The model cannot be divided over the requested number of ranks."""


def check_divisible(config: ModelConfig, world: int) -> None:
    """Raise ShardError naming the dimension that does not split evenly over `world` ranks."""
    if config.n_heads % world or config.n_kv_heads % world:
        raise ShardError(
            f"tensor parallel: cannot split {config.n_heads} attention heads / "
            f"{config.n_kv_heads} KV heads over {world} ranks; both must be multiples of the "
            f"tensor-parallel size (this model allows {_valid_sizes(config)})"
        )
    if config.ffn % world:
        raise ShardError(
            f"tensor parallel: cannot split the MLP width {config.ffn} over {world} ranks"
        )


def _valid_sizes(config: ModelConfig) -> str:
    sizes = [
        n
        for n in range(1, config.n_kv_heads + 1)
        if config.n_heads % n == 0 and config.n_kv_heads % n == 0 and config.ffn % n == 0
    ]
    return ", ".join(str(n) for n in sizes)


def shard_config(config: ModelConfig, world: int) -> ModelConfig:
    """The per-rank config: the forward then sees only its own heads and MLP width."""
    check_divisible(config, world)
    return replace(
        config,
        n_heads=config.n_heads // world,
        n_kv_heads=config.n_kv_heads // world,
        ffn=config.ffn // world,
    )


def shard_weights(
    config: ModelConfig, weights: dict[str, Tensor], rank: int, world: int
) -> tuple[ModelConfig, dict[str, Tensor]]:
    """This rank's config and weights; consumes `weights` (slices are copied, so the whole
    tensors can be freed)."""
    local = shard_config(config, world)
    widths = {
        "q": local.n_heads * config.head_dim,
        "kv": local.n_kv_heads * config.head_dim,
        "ffn": local.ffn,
    }
    out: dict[str, Tensor] = {}
    for name in list(weights):
        tensor = weights.pop(name)
        short = name.rsplit(".", 1)[-1]
        if short in _ROW_SLICED or short in _FFN_ROWS:
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
