"""The paged KV pool every forward writes and reads: K and V pages for all layers."""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from met.model.config import ModelConfig

if TYPE_CHECKING:
    from met.model.deltanet import RecurrentState


@dataclass
class PagedKvCache:
    """K and V pages, each [n_kv_layers, num_blocks, block_size, n_kv_heads, head_dim], for the
    model's attention layers (ModelConfig.kv_layers: all of them but a hybrid's recurrent ones).

    Token at position p of a sequence lives in flat slot block_table[p // block_size] *
    block_size + p % block_size; the scheduler's block manager owns which blocks are whose.
    """

    k: Tensor
    v: Tensor
    # A hybrid model's recurrent layers' state per sequence slot (LlamaModel.allocate_kv_cache).
    state: RecurrentState | None = None
    # A model layer's index among the pool's layers, where they are not all of the model's.
    kv_index: dict[int, int] | None = None

    @classmethod
    def allocate(
        cls,
        config: ModelConfig,
        num_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> PagedKvCache:
        layers = config.kv_layers()
        shape = (len(layers), num_blocks, block_size, config.n_kv_heads, config.head_dim)
        index = None if len(layers) == config.n_layers else {n: i for i, n in enumerate(layers)}
        if torch.device(device).type == "cpu":
            return cls(_lazy_zeros(shape, dtype), _lazy_zeros(shape, dtype), kv_index=index)
        return cls(
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
            kv_index=index,
        )

    @property
    def num_blocks(self) -> int:
        return self.k.shape[1]

    @property
    def block_size(self) -> int:
        return self.k.shape[2]

    def layer_slots(self, layer: int) -> tuple[Tensor, Tensor]:
        """Layer `layer`'s K and V as [num_blocks * block_size, n_kv_heads, head_dim] views."""
        n_kv, head_dim = self.k.shape[3], self.k.shape[4]
        if self.kv_index is not None:
            layer = self.kv_index[layer]
        return self.k[layer].view(-1, n_kv, head_dim), self.v[layer].view(-1, n_kv, head_dim)


def _lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """Zeroed CPU memory that the OS commits page by page as it is first written.

    An anonymous mapping is zero by contract and costs resident memory only where KV blocks have
    been written, so a pool sized for every sequence's full context is cheap until it is used.
    """
    count = math.prod(shape)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype, count=count).view(shape)
