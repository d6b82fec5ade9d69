"""Gated DeltaNet, the recurrent mixer of Qwen3.5 / Qwen3.6 and Qwen3-Next, over packed rows with
a per-sequence state addressed by the sequence's dense batch slot.

A layer (transformers' Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet, llama.cpp's qwen35 and
qwen3next graphs): one projection of the normed input into q, k, v channels, the output gate z
and per value head beta and alpha; a depthwise causal conv1d (kernel 4) + SiLU over the q, k, v
channels; q and k L2-normalised per head, q scaled by k_dim ** -0.5; each key head serves
v_heads / k_heads consecutive value heads. Per value head the state S [k_dim, v_dim] follows the
gated delta rule, token by token:

    S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q
    g = A * softplus(alpha + dt_bias) (A = -exp(A_log) < 0), beta = sigmoid(b)

then RMSNorm(o) * w * silu(z) per head and the output projection.

Prefill runs the rule chunkwise (chunk_delta_rule, flash-linear-attention's chunk form: within a
chunk the updates are one unit-lower-triangular solve, between chunks the state carries); decode
rows take one recurrent_step each, batched. Both keep the state in float32. On the CPU the rule
runs in met's C++ kernels (csrc/cpu/delta_rule.h, kernels/cpu_delta.py); the torch functions
here are their reference and run it on other devices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from met.kernels import cpu_delta
from met.model.config import RecurrentShape
from met.model.linear import Weight, linear
from met.model.recurrent_state import RecurrentState

CHUNK = 64  # tokens per chunk of the chunkwise prefill form
L2_EPS = 1e-6  # transformers' and flash-linear-attention's l2norm epsilon


@dataclass(frozen=True)
class RecurrentRows:
    """Where each row's tokens are in the packed batch and its state slot (built once per
    forward): rows of one token run the recurrent step together, longer ones chunkwise, verify
    rows (a pending token and its drafts) one recurrent step per token, as decode would run
    them, keeping the state after each."""

    decode_tokens: Tensor | None  # packed indices of single-token rows [D]
    decode_slots: Tensor | None  # their state slots [D]
    # (start, end, slot, marks) of each longer row; marks: (tokens in, checkpoint index) where
    # its state after that many of its tokens is kept (RecurrentState.ckpt_*).
    prefill: list[tuple[int, int, int, list[tuple[int, int]]]]
    verify: list[tuple[int, int, int]]  # (start, end, slot) of each verify row

    @classmethod
    def plan(
        cls,
        cu: list[int],
        slots: list[int],
        verify: list[bool],
        device: torch.device,
        marks: dict[int, list[tuple[int, int]]],
    ) -> RecurrentRows:
        rows = range(len(slots))
        checked = [(cu[b], cu[b + 1], slots[b]) for b in rows if verify[b]]
        single = [b for b in rows if cu[b + 1] - cu[b] == 1 and not verify[b]]
        long = [b for b in rows if cu[b + 1] - cu[b] > 1 and not verify[b]]
        if set(marks) - set(long):
            raise ValueError("state checkpoints fall inside prefill rows of 2 or more tokens")
        prefill = [(cu[b], cu[b + 1], slots[b], marks.get(b, [])) for b in long]
        if not single:
            return cls(None, None, prefill, checked)
        tokens = torch.tensor([cu[b] for b in single], device=device)
        decode_slots = torch.tensor([slots[b] for b in single], device=device)
        return cls(tokens, decode_slots, prefill, checked)


def plan_rows(
    state: RecurrentState | None,
    seq_lens: object,
    cu_seqlens: object,
    state_slots: object,
    device: torch.device,
    verify_rows: object = None,
    checkpoints: object = None,
) -> tuple[RecurrentState, RecurrentRows]:
    """A forward's recurrent state and row plan (the forward's seq_lens, cu_seqlens, one state
    slot per row, which rows verify drafts and the (row, position, index) checkpoints to write);
    zeroes the state of rows that start at position 0."""
    if state_slots is None or state is None:
        raise ValueError("a model with recurrent layers needs state_slots and cache.state")
    ctx = [int(n) for n in torch.as_tensor(seq_lens).tolist()]
    cu = [int(n) for n in torch.as_tensor(cu_seqlens).tolist()]
    slots = [int(n) for n in torch.as_tensor(state_slots).tolist()]
    if len(slots) != len(ctx) or not all(0 <= s < state.n_slots for s in slots):
        raise ValueError(f"state_slots: one per row, each in 0..{state.n_slots - 1}")
    state.reset([s for b, s in enumerate(slots) if ctx[b] == cu[b + 1] - cu[b]])
    verify = [False] * len(slots)
    if verify_rows is not None:
        verify = [bool(v) for v in torch.as_tensor(verify_rows).tolist()]
        state.keep_snapshots(max(cu[b + 1] - cu[b] for b in range(len(slots))))
    return state, RecurrentRows.plan(cu, slots, verify, device, _marks(state, ctx, cu, checkpoints))


def _marks(
    state: RecurrentState, ctx: list[int], cu: list[int], checkpoints: object
) -> dict[int, list[tuple[int, int]]]:
    """Per row, (tokens into the row, checkpoint index) of each checkpoint, in order."""
    marks: dict[int, list[tuple[int, int]]] = {}
    for row, position, index in [] if checkpoints is None else checkpoints:
        row, position, index = int(row), int(position), int(index)
        first = ctx[row] - (cu[row + 1] - cu[row])
        count = 0 if state.ckpt_conv is None else state.ckpt_conv.shape[0]
        if not (first < position <= ctx[row] and 0 <= index < count):
            raise ValueError(f"state checkpoint at {position} into {index}: outside row {row}")
        marks.setdefault(row, []).append((position - first, index))
    return {row: sorted(m) for row, m in marks.items()}


def recurrent_step(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """One token of the gated delta rule for a batch: q, k [B, heads, k_dim], v [B, heads,
    v_dim], g, beta [B, heads], state [B, heads, k_dim, v_dim] (float32). Returns (o [B, heads,
    v_dim], the new state)."""
    state = state * g.exp()[..., None, None]
    predicted = (state * k[..., None]).sum(dim=-2)  # S^T k
    delta = (v - predicted) * beta[..., None]
    state = state + k[..., :, None] * delta[..., None, :]
    return (state * q[..., None]).sum(dim=-2), state


def chunk_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    chunk: int = CHUNK,
) -> tuple[Tensor, Tensor]:
    """The gated delta rule over one sequence's tokens, chunkwise: q, k [heads, T, k_dim], v
    [heads, T, v_dim], g, beta [heads, T], state [heads, k_dim, v_dim] (float32). Returns (o
    [heads, T, v_dim], the state after the last token).

    Within a chunk, with G_t the cumulative log decay from the chunk's start, each token's
    update u_t = beta_t (v_t - S_t^T k_t) depends on the earlier ones through
    u_t + beta_t sum_{j<t} e^{G_t - G_j} (k_t . k_j) u_j = beta_t (v_t - e^{G_t} S_0^T k_t),
    one unit-lower-triangular system per chunk; then o_t = e^{G_t} S_0^T q_t +
    sum_{j<=t} e^{G_t - G_j} (q_t . k_j) u_j and S_C = e^{G_C} S_0 + sum_j e^{G_C - G_j} k_j u_j^T.
    """
    outputs = []
    for start in range(0, q.shape[1], chunk):
        end = min(start + chunk, q.shape[1])
        o, state = _chunk(
            q[:, start:end], k[:, start:end], v[:, start:end], g[:, start:end],
            beta[:, start:end], state,
        )  # fmt: skip
        outputs.append(o)
    return torch.cat(outputs, dim=1), state


def _chunk(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    n = q.shape[1]
    cum = g.cumsum(dim=-1)  # [heads, n]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    # decay[t, j] = e^{G_t - G_j} for j <= t, 0 above the diagonal (masked before exp: G_t - G_j
    # > 0 there and could overflow).
    decay = (cum[:, :, None] - cum[:, None, :]).masked_fill(~causal, float("-inf")).exp()
    kk = (k @ k.transpose(-1, -2)) * decay * beta[:, :, None]
    system = kk.tril(-1) + torch.eye(n, dtype=q.dtype, device=q.device)
    rhs = beta[:, :, None] * (v - cum.exp()[:, :, None] * (k @ state))
    u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    scores = (q @ k.transpose(-1, -2)) * decay
    o = cum.exp()[:, :, None] * (q @ state) + scores @ u
    tail = (cum[:, -1:] - cum).exp()  # e^{G_C - G_j}
    state = cum[:, -1].exp()[:, None, None] * state + (k * tail[:, :, None]).transpose(-1, -2) @ u
    return o, state


def token_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """chunk_delta_rule's result one token at a time (its reference)."""
    outputs = []
    for t in range(q.shape[1]):
        o, state = recurrent_step(
            q[None, :, t], k[None, :, t], v[None, :, t], g[None, :, t], beta[None, :, t],
            state[None],
        )  # fmt: skip
        state = state[0]
        outputs.append(o[0])
    return torch.stack(outputs, dim=1), state


class DeltaNetLayer:
    """One Gated DeltaNet mixer: the canonical ssm_* weights of a layer (model/config.py),
    its q/k/v/z/beta/alpha projections fused into one weight through `fuse` (row parts as stored
    where a quantized file keeps the small beta and alpha in another format)."""

    def __init__(
        self,
        take: Callable[[str], Weight],
        prefix: str,
        shape: RecurrentShape,
        eps: float,
        index: int,
        fuse: Callable[[list[Weight]], Weight],
    ) -> None:
        self.shape, self.eps, self.index = shape, eps, index
        names = ("ssm_qkv", "ssm_z", "ssm_beta", "ssm_alpha")
        self.w_in = fuse([take(prefix + n) for n in names])
        self.conv = take(prefix + "ssm_conv")  # [conv_dim, kernel]
        self.dt_bias = take(prefix + "ssm_dt").float()
        self.decay = take(prefix + "ssm_a").float()  # -exp(A_log)
        self.norm = take(prefix + "ssm_norm")
        self.w_out = take(prefix + "ssm_out")

    def __call__(self, x: Tensor, state: RecurrentState, rows: RecurrentRows) -> Tensor:
        s = self.shape
        projected = linear(x, self.w_in)
        qkv, z, b, a = projected.split([s.conv_dim, s.value_width, s.v_heads, s.v_heads], dim=-1)
        mixed = self._conv(qkv, state, rows)
        q, k, v = mixed.split([s.k_heads * s.k_dim, s.k_heads * s.k_dim, s.value_width], dim=-1)
        n_tok, group = x.shape[0], s.v_heads // s.k_heads
        q = _l2norm(q.float().view(n_tok, s.k_heads, s.k_dim)) * s.k_dim**-0.5
        k = _l2norm(k.float().view(n_tok, s.k_heads, s.k_dim))
        if group > 1 and s.tiled:
            q, k = q.repeat(1, group, 1), k.repeat(1, group, 1)
        elif group > 1:
            q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)
        v = v.float().view(n_tok, s.v_heads, s.v_dim)
        beta = torch.sigmoid(b.float())
        g = self.decay * F.softplus(a.float() + self.dt_bias)
        o = self._delta_rule(q, k, v, g, beta, state, rows).to(x.dtype)
        o = F.rms_norm(o, (s.v_dim,), self.norm, self.eps) * F.silu(z.view(n_tok, s.v_heads, -1))
        return linear(o.reshape(n_tok, s.value_width), self.w_out)

    def _conv(self, qkv: Tensor, state: RecurrentState, rows: RecurrentRows) -> Tensor:
        """The causal depthwise conv + SiLU of each row's q/k/v channels, continuing from its
        slot's last kernel - 1 inputs, which it then replaces."""
        conv_state, out = state.conv[self.index], torch.empty_like(qkv)
        if rows.decode_tokens is not None:
            self._conv_step(qkv, out, conv_state, rows.decode_tokens, rows.decode_slots)
        for start, end, slot in rows.verify:
            one = torch.tensor([slot], device=qkv.device)
            for j, t in enumerate(range(start, end)):
                token = torch.tensor([t], device=qkv.device)
                self._conv_step(qkv, out, conv_state, token, one)
                state.snap_conv[self.index, slot, j] = conv_state[slot]
        kept = conv_state.shape[-1]
        for start, end, slot, marks in rows.prefill:
            window = torch.cat([conv_state[slot], qkv[start:end].t()], dim=-1)
            conved = F.conv1d(window[None], self.conv[:, None, :], groups=window.shape[0])
            out[start:end] = conved[0].t()
            for tokens, index in marks:  # the last inputs after that many tokens
                state.ckpt_conv[index, self.index] = window[:, tokens : tokens + kept]
            conv_state[slot] = window[:, window.shape[1] - kept :]
        return F.silu(out)

    def _conv_step(
        self, qkv: Tensor, out: Tensor, conv_state: Tensor, tokens: Tensor, slots: Tensor
    ) -> None:
        window = torch.cat([conv_state[slots], qkv[tokens, :, None]], dim=-1)
        out[tokens] = (window * self.conv).sum(dim=-1)
        conv_state[slots] = window[..., 1:]

    def _delta_rule(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
        state: RecurrentState,
        rows: RecurrentRows,
    ) -> Tensor:
        delta, out = state.delta[self.index], v.new_empty(v.shape)
        native = cpu_delta.runs(delta)
        inputs = (q, k, v, g, beta)
        if rows.decode_tokens is not None:
            _step(inputs, out, delta, rows.decode_tokens, rows.decode_slots, native)
        for start, end, slot in rows.verify:
            one = torch.tensor([slot], device=v.device)
            for j, t in enumerate(range(start, end)):
                _step(inputs, out, delta, torch.tensor([t], device=v.device), one, native)
                state.snap_delta[self.index, slot, j] = delta[slot]
        for start, end, slot, marks in rows.prefill:
            # A checkpoint ends a piece: the state there is the one a resumed row starts from.
            a = start
            for tokens, index in [*marks, (end - start, None)]:
                if a < start + tokens:
                    parts = [x[a : start + tokens] for x in inputs]
                    out[a : start + tokens] = _chunked(parts, delta, slot, native)
                if index is not None:
                    state.ckpt_delta[index, self.index] = delta[slot]
                a = start + tokens
        return out


def _step(
    inputs: tuple[Tensor, ...], out: Tensor, delta: Tensor, t: Tensor, slots: Tensor, native: bool
) -> None:
    """One recurrent step of the rows whose tokens are `t`, their states at `slots`."""
    q, k, v, g, beta = (x[t] for x in inputs)
    if native:
        out[t] = cpu_delta.step(q, k, v, g, beta, delta, slots)
    else:
        out[t], delta[slots] = recurrent_step(q, k, v, g, beta, delta[slots])


def _chunked(parts: list[Tensor], delta: Tensor, slot: int, native: bool) -> Tensor:
    """A row's tokens (q, k, v, g, beta) in the chunk form from its slot's state, updated."""
    if native:
        return cpu_delta.chunk(*parts, delta[slot], CHUNK)
    o, delta[slot] = chunk_delta_rule(*(x.transpose(0, 1) for x in parts), delta[slot])
    return o.transpose(0, 1)


def _l2norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)
