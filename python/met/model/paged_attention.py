"""Paged attention for LlamaModel's torch forward: where each row's queries and keys are (one
plan per forward, per window and grouped-query shape, shared by the layers that have it) and
attention over the pool's slots, prefill rows one by one and decode rows in one batched call,
with attention sinks and soft-capping where the layer has them.

A mixin: LlamaModel reads its config, device and dtype; a test reference overrides
_attention to run it through the C++ kernels (test_cpu_model.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from met.model.kv_cache import PagedKvCache
from met.model.sinks import grouped_sinks, with_sink_column
from met.model.softcap import softcapped_attention

IntArray = Tensor | np.ndarray | Sequence[int]


@dataclass
class _PrefillRow:
    start: int  # packed index of the row's first query token
    end: int
    slots: (
        Tensor | None
    )  # cache slots of the whole context; None: no earlier context, use fresh K/V
    mask: Tensor  # [groups * query_len, context] additive (0 or -inf)


@dataclass
class _AttnPlan:
    """Where each row's queries and keys are; built once per forward, shared by all layers."""

    decode_tokens: Tensor | None  # packed indices of single-token rows [D]; None when no such row
    decode_slots: Tensor | None  # [D, max_context] cache slots (padding clamped to a valid slot)
    decode_mask: Tensor | None  # [D, 1, 1, max_context] additive (0 or -inf)
    prefill: list[_PrefillRow]
    all_decode: bool  # every row is a single token, in packed order: no scatter needed


class PagedAttention:
    """_plan builds a forward's attention plans; _attention runs one layer's attention."""

    def _sdpa(
        self, q: Tensor, keys: Tensor, values: Tensor, mask: Tensor, sinks: Tensor | None = None
    ) -> Tensor:
        c = self.config
        if sinks is not None:
            keys, values, mask = with_sink_column(keys, values, mask, sinks)
        if c.attn_softcap:
            return softcapped_attention(q, keys, values, mask, c.query_scale, c.attn_softcap)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=c.query_scale)

    def _attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        plan: _AttnPlan,
        sinks: Tensor | None = None,
    ) -> Tensor:
        """[T, n_heads * head_dim] attention output for the packed queries q [T, n_heads, dim];
        sinks [n_heads]: each head's sink logit (None: no sinks)."""
        if plan.all_decode:
            return self._decode_attention(q, k_cache, v_cache, plan, sinks)
        out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
        if plan.decode_tokens is not None:
            out[plan.decode_tokens] = self._decode_attention(
                q[plan.decode_tokens], k_cache, v_cache, plan, sinks
            )
        for row in plan.prefill:
            if row.slots is None:
                keys, values = k[row.start : row.end], v[row.start : row.end]
            else:
                keys = k_cache[row.slots].to(q.dtype)
                values = v_cache[row.slots].to(q.dtype)
            out[row.start : row.end] = self._row_attention(
                q[row.start : row.end], keys, values, row.mask, sinks
            )
        return out

    def _row_attention(
        self, q: Tensor, keys: Tensor, values: Tensor, mask: Tensor, sinks: Tensor | None = None
    ) -> Tensor:
        # Query heads sharing a KV head become extra query rows of that head ([kv, groups * q]),
        # so grouped-query attention runs without copying K/V once per query head. Inputs stay
        # 4-D: torch's CPU flash kernel takes only those (3-D falls back to the slow math path).
        (n_q, n_heads, head_dim), n_kv = q.shape, keys.shape[1]
        groups = n_heads // n_kv
        qg = q.permute(1, 0, 2).reshape(1, n_kv, groups * n_q, head_dim)
        row_sinks = None if sinks is None else grouped_sinks(sinks, groups, n_q)
        kt, vt = keys.transpose(0, 1)[None], values.transpose(0, 1)[None]
        out = self._sdpa(qg, kt, vt, mask, row_sinks)
        return out.view(n_heads, n_q, head_dim).transpose(0, 1).reshape(n_q, -1)

    def _decode_attention(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        plan: _AttnPlan,
        sinks: Tensor | None = None,
    ) -> Tensor:
        (n_rows, n_heads, head_dim), n_kv = q.shape, k_cache.shape[1]
        keys = k_cache[plan.decode_slots].to(q.dtype).transpose(1, 2)  # [D, kv, context, dim]
        values = v_cache[plan.decode_slots].to(q.dtype).transpose(1, 2)
        qg = q.view(n_rows, n_kv, n_heads // n_kv, head_dim)
        head_sinks = None if sinks is None else sinks.view(1, n_kv, n_heads // n_kv)
        out = self._sdpa(qg, keys, values, plan.decode_mask, head_sinks)
        return out.reshape(n_rows, n_heads * head_dim)

    def _plan(
        self,
        cache: PagedKvCache,
        block_tables: IntArray,
        seq_lens: IntArray,
        cu_seqlens: IntArray,
        window: int | None,
        groups: int,
    ) -> _AttnPlan:
        """The rows' attention plan for layers that read the last `window` keys (None: all),
        `groups` query heads to each KV head."""
        dev, bs = self.device, cache.block_size
        tables = torch.as_tensor(block_tables, dtype=torch.long).to(dev)
        ctx = [int(n) for n in torch.as_tensor(seq_lens).tolist()]
        cu = [int(n) for n in torch.as_tensor(cu_seqlens).tolist()]
        if tables.dim() != 2 or tables.shape[0] != len(ctx) or len(cu) != len(ctx) + 1:
            raise ValueError("block_tables [B, max_blocks], seq_lens [B], cu_seqlens [B + 1]")
        if max(ctx, default=0) > tables.shape[1] * bs:
            raise ValueError("a row's context is longer than its block table covers")
        single = [b for b in range(len(ctx)) if cu[b + 1] - cu[b] == 1]
        prefill = [
            self._prefill_row(tables[b], ctx[b], cu[b], cu[b + 1], bs, window, groups)
            for b in range(len(ctx))
            if cu[b + 1] - cu[b] > 1
        ]
        if not single:
            return _AttnPlan(None, None, None, prefill, all_decode=False)
        longest = max(ctx[b] for b in single)
        key_pos = torch.arange(longest, device=dev)
        blocks = tables[single][:, key_pos // bs]
        slots = (blocks * bs + key_pos % bs).clamp_(min=0)
        lens = torch.tensor([ctx[b] for b in single], device=dev)
        allowed = key_pos[None, :] < lens[:, None]
        if window:
            allowed &= key_pos[None, :] >= lens[:, None] - window
        mask = self._additive(allowed[:, None, None, :])
        tokens = torch.tensor([cu[b] for b in single], device=dev)
        return _AttnPlan(tokens, slots, mask, prefill, all_decode=len(single) == len(ctx))

    def _additive(self, allowed: Tensor) -> Tensor:
        """0 where attention is allowed, -inf elsewhere, in the model dtype: built once per
        forward, where a bool mask would be converted again by every layer's SDPA call."""
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        return mask.masked_fill_(~allowed, float("-inf"))

    def _prefill_row(
        self,
        table: Tensor,
        ctx: int,
        start: int,
        end: int,
        bs: int,
        window: int | None,
        groups: int,
    ) -> _PrefillRow:
        dev, n_q = self.device, end - start
        key_pos = torch.arange(ctx, device=dev)
        query_pos = torch.arange(ctx - n_q, ctx, device=dev)
        allowed = key_pos[None, :] <= query_pos[:, None]
        if window:
            allowed &= key_pos[None, :] > query_pos[:, None] - window
        mask = self._additive(allowed.repeat(groups, 1))
        # A row that starts at position 0 has all its keys in this step's fresh K/V.
        slots = None if ctx == n_q else table[key_pos // bs] * bs + key_pos % bs
        return _PrefillRow(start, end, slots, mask)
