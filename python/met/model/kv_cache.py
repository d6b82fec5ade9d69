"""The paged KV pool every forward writes and reads: K and V pages for the layers that own KV."""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from met.model.config import ModelConfig

if TYPE_CHECKING:
    from met.model.recurrent_state import RecurrentState

KvShape = tuple[int, int]  # (n_kv_heads, head_dim) of one layer's K (and V) rows


def layer_kv_shapes(config: ModelConfig, tp_size: int = 1) -> list[KvShape | None]:
    """Each layer's KV row shape in the pool (this rank's share of the heads), None for a layer
    that stores none: one attending over an earlier layer's KV (shared KV) or a recurrent one (a
    hybrid's: its state lives in the recurrent pool)."""
    shapes: list[KvShape | None] = []
    for spec in config.layer_specs():
        if spec.kv_source is not None or spec.mixer == "recurrent":
            shapes.append(None)
            continue
        n_kv = spec.n_kv_heads or config.n_kv_heads
        shapes.append((n_kv // tp_size, spec.head_dim or config.head_dim))
    return shapes


@dataclass
class PagedKvCache:
    """K and V pages, each [n_kv_layers, num_blocks, block_size, n_kv_heads, head_dim], for the
    model's attention layers (ModelConfig.kv_layers: all of them but a hybrid's recurrent ones).

    Token at position p of a sequence lives in flat slot block_table[p // block_size] *
    block_size + p % block_size; the scheduler's block manager owns which blocks are whose.

    A model whose layers differ in KV width (Gemma 4: 256- and 512-wide heads) keeps one such
    pair per width, `k`/`v` the first; `where` maps each layer to (group, index in the group),
    a shared-KV layer to its source's. None: one group, layer i at index i (what the C++ and
    CUDA forwards address).
    """

    k: Tensor
    v: Tensor
    others: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    where: list[tuple[int, int] | None] | None = None
    # A hybrid model's recurrent layers' state per sequence slot (LlamaModel.allocate_kv_cache).
    state: RecurrentState | None = None

    @classmethod
    def allocate(
        cls,
        config: ModelConfig,
        num_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> PagedKvCache:
        shapes = layer_kv_shapes(config)
        if all(s == (config.n_kv_heads, config.head_dim) for s in shapes):
            groups = {shapes[0]: config.n_layers}
            where = None
        else:
            groups, where = _layout(config, shapes)

        def pages(count: int, shape: KvShape) -> Tensor:
            full = (count, num_blocks, block_size, *shape)
            if torch.device(device).type == "cpu":
                return _lazy_zeros(full, dtype)
            return torch.zeros(full, dtype=dtype, device=device)

        pairs = [(pages(n, s), pages(n, s)) for s, n in groups.items()]
        return cls(pairs[0][0], pairs[0][1], pairs[1:], where)

    @property
    def num_blocks(self) -> int:
        return self.k.shape[1]

    @property
    def block_size(self) -> int:
        return self.k.shape[2]

    def layer_slots(self, layer: int) -> tuple[Tensor, Tensor]:
        """Layer `layer`'s K and V as [num_blocks * block_size, n_kv_heads, head_dim] views
        (a shared-KV layer's are its source layer's)."""
        place = (0, layer) if self.where is None else self.where[layer]
        if place is None:
            raise ValueError(f"layer {layer} keeps no K/V (a recurrent layer)")
        group, index = place
        k, v = (self.k, self.v) if group == 0 else self.others[group - 1]
        n_kv, head_dim = k.shape[3], k.shape[4]
        return k[index].view(-1, n_kv, head_dim), v[index].view(-1, n_kv, head_dim)


def _layout(
    config: ModelConfig, shapes: list[KvShape | None]
) -> tuple[dict[KvShape, int], list[tuple[int, int] | None]]:
    """Layers grouped by KV shape: each group's layer count, and each layer's place."""
    groups: dict[KvShape, int] = {}
    where: list[tuple[int, int] | None] = []
    for i, shape in enumerate(shapes):
        if shape is None and config.layer_specs()[i].kv_source is None:
            where.append(None)  # a recurrent layer: no pages
            continue
        if shape is None:
            source = config.layer_specs()[i].kv_source
            if source is None or not 0 <= source < i or shapes[source] is None:
                raise ValueError(f"layer {i}: shared KV must come from an earlier layer's own")
            where.append(where[source])
            continue
        group = list(groups).index(shape) if shape in groups else len(groups)
        where.append((group, groups.get(shape, 0)))
        groups[shape] = groups.get(shape, 0) + 1
    return groups, where


def _lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    """Zeroed CPU memory that the OS commits page by page as it is first written.

    An anonymous mapping is zero by contract and costs resident memory only where KV blocks have
    been written, so a pool sized for every sequence's full context is cheap until it is used.
    """
    count = math.prod(shape)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype, count=count).view(shape)
