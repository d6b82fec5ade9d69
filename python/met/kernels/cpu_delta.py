"""The gated delta rule's C++ kernels (csrc/cpu/delta_rule.h) over CPU float32 tensors: the
recurrent step of a batch of rows, each at its own state slot, and the chunkwise form over one
row's tokens. The layouts are token-major, as model/deltanet.py holds them."""

from __future__ import annotations

import torch
from torch import Tensor

from met import _core


def runs(state: Tensor) -> bool:
    """Whether the kernels take this state (a CPU float32 pool)."""
    return state.device.type == "cpu" and state.dtype == torch.float32


def step(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, states: Tensor, slots: Tensor
) -> Tensor:
    """One token per row: q, k [R, heads, k_dim], v [R, heads, v_dim], g, beta [R, heads];
    states [slots, heads, k_dim, v_dim] updated in place at slots [R]. Returns o [R, heads,
    v_dim]."""
    q, k, v, g, beta = (x.float().contiguous() for x in (q, k, v, g, beta))
    slots = slots.to(torch.int64).contiguous()
    if not states.is_contiguous():
        raise ValueError("delta rule: the state pool must be contiguous")
    out = torch.empty_like(v)
    rows, heads, k_dim = q.shape
    _core.cpu.delta_rule_step(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(),
        states.data_ptr(), slots.data_ptr(), out.data_ptr(), rows, heads, k_dim, v.shape[-1],
    )  # fmt: skip
    return out


def chunk(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, size: int
) -> Tensor:
    """One row's tokens (the layout of step's, T tokens for R rows), chunks of `size` tokens;
    state [heads, k_dim, v_dim] updated in place. Returns o [T, heads, v_dim]."""
    q, k, v, g, beta = (x.float().contiguous() for x in (q, k, v, g, beta))
    if not state.is_contiguous():
        raise ValueError("delta rule: the state must be contiguous")
    out = torch.empty_like(v)
    tokens, heads, k_dim = q.shape
    _core.cpu.delta_rule_chunk(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(),
        state.data_ptr(), out.data_ptr(), tokens, heads, k_dim, v.shape[-1], size,
    )  # fmt: skip
    return out
