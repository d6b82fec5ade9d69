"""met.kernels.cuda_ops' functions written in plain torch, for CPU tests of the code around them.

Same signatures and semantics as the CUDA kernels (kernels.h): padding slots < 0 are skipped by
kv_append, rows with seq_len 0 get zero attention, RoPE tables are float32. The kernels
themselves are checked against torch on a GPU in test_cuda_kernels.py; this lets CudaLlama's
packing, validation and graph padding run here.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from met import _core
from met.kernels.cuda_ops import rope_tables

__all__ = [
    "argmax",
    "attention_workspace",
    "kv_append",
    "paged_attention",
    "rms_norm",
    "rope_",
    "rope_tables",
    "sample",
    "silu_mul",
]


def attention_workspace(*_args) -> None:
    return None


def rms_norm(x: Tensor, weight: Tensor, eps: float, out=None, stream=None) -> Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rope_(x: Tensor, positions: Tensor, cos: Tensor, sin: Tensor, stream=None) -> Tensor:
    half = x.shape[-1] // 2
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    x.copy_(torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1))
    return x


def kv_append(k_cache, v_cache, k, v, slot_mapping, stream=None) -> None:
    keep = slot_mapping >= 0
    n_kv, dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, n_kv, dim)[slot_mapping[keep]] = k[keep]
    v_cache.view(-1, n_kv, dim)[slot_mapping[keep]] = v[keep]


def paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    cu_seqlens: Tensor,
    max_query_len: int,
    max_seq_len: int,
    scale=None,
    out=None,
    workspace=None,
    stream=None,
) -> Tensor:
    """Causal attention of each row's queries over its first seq_len cached positions."""
    assert max(int(n) for n in torch.diff(cu_seqlens)) <= max_query_len
    assert int(seq_lens.max()) <= max_seq_len
    _, block_size, n_kv, dim = k_cache.shape
    groups = q.shape[1] // n_kv
    out = torch.zeros(q.shape, dtype=q.dtype)
    cu = cu_seqlens.tolist()
    for b, ctx in enumerate(seq_lens.tolist()):
        q_len = cu[b + 1] - cu[b]
        if ctx == 0:
            continue
        key_pos = torch.arange(ctx)
        slots = block_tables[b, key_pos // block_size].long() * block_size + key_pos % block_size
        keys = k_cache.view(-1, n_kv, dim)[slots].repeat_interleave(groups, 1).transpose(0, 1)
        values = v_cache.view(-1, n_kv, dim)[slots].repeat_interleave(groups, 1).transpose(0, 1)
        mask = key_pos[None, :] <= torch.arange(ctx - q_len, ctx)[:, None]
        rows = q[cu[b] : cu[b + 1]].transpose(0, 1)
        out[cu[b] : cu[b + 1]] = F.scaled_dot_product_attention(
            rows, keys, values, attn_mask=mask, scale=scale
        ).transpose(0, 1)
    return out


def silu_mul(x: Tensor, out=None, stream=None) -> Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def argmax(logits: Tensor, out=None, stream=None) -> Tensor:
    return logits.argmax(dim=-1).to(torch.int32)


def sample(logits, temperature, top_k, top_p, min_p, seed, step, out=None, stream=None) -> Tensor:
    """The kernel's own CPU reference (csrc/kernels/reference), draw for draw."""
    draws = _core.kernel_refs.sample(
        logits.numpy(),
        temperature.numpy(),
        top_k.numpy(),
        top_p.numpy(),
        min_p.numpy(),
        seed.numpy().view(np.uint64),
        step.numpy().view(np.uint64),
    )
    return torch.from_numpy(draws)
