"""Torch wrappers over met._core.cuda (csrc/kernels/kernels.h): tensors in, raw pointers out.

Each function checks device, dtype, shape and layout, then launches on the current torch stream
(or `stream`), so calls order with torch's own work and are legal inside CUDA-graph capture. The
model plugs them in where it now calls F.rms_norm, _rotate, index_copy_, SDPA, F.silu * up and
argmax; see available() before choosing this path.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from met import _core

_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def available() -> bool:
    """True when met._core was built with CUDA and torch sees a GPU."""
    return bool(_core.has_cuda()) and torch.cuda.is_available()


def _cuda():
    if not _core.has_cuda():
        raise RuntimeError("met._core was built without CUDA (rebuild with nvcc present)")
    return _core.cuda


def _handle(stream: torch.cuda.Stream | None) -> int:
    return (stream if stream is not None else torch.cuda.current_stream()).cuda_stream


def _check(t: Tensor, name: str, dtype: torch.dtype | None = None, inner: bool = False) -> None:
    """On the GPU, of `dtype`, and contiguous (only within each row when `inner`)."""
    if not t.is_cuda:
        raise ValueError(f"{name} must be a CUDA tensor, got {t.device}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
    if t.dtype not in _DTYPES and dtype is None:
        raise ValueError(f"{name}: dtype {t.dtype} is not float32, float16 or bfloat16")
    packed = t[0].is_contiguous() if inner and t.dim() > 1 and t.shape[0] else t.is_contiguous()
    if not packed:
        raise ValueError(f"{name} must be contiguous{' within each row' if inner else ''}")


def _same(tensors: dict[str, Tensor], dtype: torch.dtype) -> None:
    for name, t in tensors.items():
        _check(t, name, dtype, inner=name in ("q", "k", "v", "x"))


def attention_workspace(
    batch: int, n_heads: int, head_dim: int, n_kv_heads: int, max_seq_len: int, device
) -> Tensor | None:
    """Scratch for paged_attention of a decode batch; allocate once to capture it in a graph."""
    floats = _cuda().attention_workspace_floats(
        **_decode_sizes(batch, n_heads, head_dim, n_kv_heads, max_seq_len)
    )
    return torch.empty(floats, dtype=torch.float32, device=device) if floats else None


def _decode_sizes(batch, n_heads, head_dim, n_kv_heads, max_seq_len) -> dict:
    # Only sizes matter to the workspace query; pointers stay null.
    return dict(
        out=0,
        q=0,
        k_cache=0,
        v_cache=0,
        block_tables=0,
        seq_lens=0,
        cu_seqlens=0,
        batch=batch,
        max_blocks=1,
        n_heads=n_heads,
        max_query_len=1,
        max_seq_len=max_seq_len,
        scale=1.0,
        block_size=1,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        dtype=0,
    )


def paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    cu_seqlens: Tensor,
    max_query_len: int,
    max_seq_len: int,
    scale: float | None = None,
    out: Tensor | None = None,
    workspace: Tensor | None = None,
    stream: torch.cuda.Stream | None = None,
) -> Tensor:
    """Causal attention of packed queries q [T, n_heads, dim] over one layer's paged cache.

    k_cache/v_cache: [num_blocks, block_size, n_kv_heads, dim]; block_tables int32 [B, max_blocks];
    seq_lens int32 [B] (context including this step's tokens, already appended); cu_seqlens int32
    [B + 1]. max_query_len / max_seq_len bound the rows' query counts and contexts (they fix the
    grid: pass capacities, not this step's values, under graph capture). q may be a view into a
    fused QKV row (rows any stride, heads packed). Returns out [T, n_heads, dim].
    """
    _same({"q": q, "k_cache": k_cache, "v_cache": v_cache}, q.dtype)
    for name, t in (
        ("block_tables", block_tables),
        ("seq_lens", seq_lens),
        ("cu_seqlens", cu_seqlens),
    ):
        _check(t, name, torch.int32)
    n_tokens, n_heads, dim = q.shape
    _, block_size, n_kv_heads, cache_dim = k_cache.shape
    if cache_dim != dim or v_cache.shape != k_cache.shape:
        raise ValueError("q, k_cache and v_cache disagree on head_dim or shape")
    batch = block_tables.shape[0]
    if seq_lens.shape != (batch,) or cu_seqlens.shape != (batch + 1,):
        raise ValueError("seq_lens must be [B] and cu_seqlens [B + 1] for block_tables [B, ...]")
    if out is None:
        out = torch.empty(n_tokens, n_heads, dim, dtype=q.dtype, device=q.device)
    _check(out, "out", q.dtype)
    args = dict(
        out=out.data_ptr(),
        q=q.data_ptr(),
        k_cache=k_cache.data_ptr(),
        v_cache=v_cache.data_ptr(),
        block_tables=block_tables.data_ptr(),
        seq_lens=seq_lens.data_ptr(),
        cu_seqlens=cu_seqlens.data_ptr(),
        batch=batch,
        max_blocks=block_tables.shape[1],
        n_heads=n_heads,
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
        q_row_stride=q.stride(0),
        scale=scale if scale is not None else 1.0 / math.sqrt(dim),
        block_size=block_size,
        n_kv_heads=n_kv_heads,
        head_dim=dim,
        dtype=_DTYPES[q.dtype],
    )
    floats = _cuda().attention_workspace_floats(**args)
    if floats:
        if workspace is None:
            workspace = torch.empty(floats, dtype=torch.float32, device=q.device)
        if workspace.numel() < floats or workspace.dtype != torch.float32:
            raise ValueError(f"workspace needs {floats} float32 elements")
        args["workspace"] = workspace.data_ptr()
    _cuda().paged_attention(_handle(stream), **args)
    return out


def kv_append(
    k_cache: Tensor,
    v_cache: Tensor,
    k: Tensor,
    v: Tensor,
    slot_mapping: Tensor,
    stream: torch.cuda.Stream | None = None,
) -> None:
    """k_cache.view(-1, kv, dim)[slot_mapping] = k (and v); slots < 0 are skipped.

    k, v: [T, n_kv_heads, dim], possibly views into a fused QKV row; slot_mapping int64 [T].
    """
    _same({"k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v}, k.dtype)
    _check(slot_mapping, "slot_mapping", torch.int64)
    _, block_size, n_kv_heads, dim = k_cache.shape
    if k.shape[1:] != (n_kv_heads, dim) or v.shape != k.shape or k.stride(0) != v.stride(0):
        raise ValueError("k and v must be [T, n_kv_heads, head_dim] with equal row strides")
    _cuda().kv_append(
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        slot_mapping.data_ptr(),
        k.shape[0],
        k.stride(0),
        block_size,
        n_kv_heads,
        dim,
        _DTYPES[k.dtype],
        _handle(stream),
    )


def rms_norm(
    x: Tensor,
    weight: Tensor,
    eps: float,
    out: Tensor | None = None,
    stream: torch.cuda.Stream | None = None,
) -> Tensor:
    """F.rms_norm(x, (hidden,), weight, eps) for contiguous x [T, hidden]."""
    _same({"x": x, "weight": weight}, x.dtype)
    if not x.is_contiguous():
        raise ValueError("x must be contiguous")
    out = torch.empty_like(x) if out is None else out
    _check(out, "out", x.dtype)
    _cuda().rms_norm(
        out.data_ptr(),
        x.data_ptr(),
        weight.data_ptr(),
        x.shape[0],
        x.shape[-1],
        eps,
        _DTYPES[x.dtype],
        _handle(stream),
    )
    return out


def rope_tables(inv_freq: list[float], max_positions: int, device) -> tuple[Tensor, Tensor]:
    """float32 cos, sin [max_positions, head_dim / 2], angles computed in float64."""
    freqs = torch.tensor(inv_freq, dtype=torch.float64)
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * freqs[None, :]
    return angles.cos().float().to(device), angles.sin().float().to(device)


def rope_(
    x: Tensor,
    positions: Tensor,
    cos: Tensor,
    sin: Tensor,
    stream: torch.cuda.Stream | None = None,
) -> Tensor:
    """Rotate-half RoPE in place on every head of x [T, heads, dim] (a view of QKV is fine)."""
    _check(x, "x", inner=True)
    _check(positions, "positions", torch.int64)
    _check(cos, "cos", torch.float32)
    _check(sin, "sin", torch.float32)
    n_tokens, n_heads, dim = x.shape
    if cos.shape[1] * 2 != dim or sin.shape != cos.shape:
        raise ValueError("cos and sin must be [max_positions, head_dim / 2]")
    _cuda().rope(
        x.data_ptr(),
        positions.data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        n_tokens,
        n_heads,
        dim,
        x.stride(0),
        _DTYPES[x.dtype],
        _handle(stream),
    )
    return x


def silu_mul(
    x: Tensor, out: Tensor | None = None, stream: torch.cuda.Stream | None = None
) -> Tensor:
    """F.silu(gate) * up for x [T, 2 * ffn] = gate | up (the fused gate/up matmul output)."""
    _check(x, "x")
    n_tokens, ffn = x.shape[0], x.shape[1] // 2
    out = torch.empty(n_tokens, ffn, dtype=x.dtype, device=x.device) if out is None else out
    _check(out, "out", x.dtype)
    _cuda().silu_mul(out.data_ptr(), x.data_ptr(), n_tokens, ffn, _DTYPES[x.dtype], _handle(stream))
    return out


def argmax(
    logits: Tensor, out: Tensor | None = None, stream: torch.cuda.Stream | None = None
) -> Tensor:
    """int32 [rows]: first index of each row's largest float32 logit (NaN wins, as in torch)."""
    _check(logits, "logits", torch.float32)
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int32, device=logits.device) if out is None else out
    _check(out, "out", torch.int32)
    _cuda().argmax(out.data_ptr(), logits.data_ptr(), rows, vocab, _handle(stream))
    return out


def sample(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    min_p: Tensor,
    seed: Tensor,
    step: Tensor,
    out: Tensor | None = None,
    stream: torch.cuda.Stream | None = None,
) -> Tensor:
    """int32 [rows]: one draw per row of float32 logits [rows, vocab] (kernels.h `sample`).

    Per-row device arrays: temperature/top_p/min_p float32, top_k int32, seed/step int64 (read
    as uint64). Greedy where temperature <= 0 or top_k == 1.
    """
    _check(logits, "logits", torch.float32)
    rows, vocab = logits.shape
    params = {
        "temperature": (temperature, torch.float32),
        "top_k": (top_k, torch.int32),
        "top_p": (top_p, torch.float32),
        "min_p": (min_p, torch.float32),
        "seed": (seed, torch.int64),
        "step": (step, torch.int64),
    }
    for name, (t, dtype) in params.items():
        _check(t, name, dtype)
        if t.shape != (rows,):
            raise ValueError(f"{name} must have one entry per row ({rows})")
    out = torch.empty(rows, dtype=torch.int32, device=logits.device) if out is None else out
    _check(out, "out", torch.int32)
    _cuda().sample(
        out.data_ptr(),
        logits.data_ptr(),
        temperature.data_ptr(),
        top_k.data_ptr(),
        top_p.data_ptr(),
        min_p.data_ptr(),
        seed.data_ptr(),
        step.data_ptr(),
        rows,
        vocab,
        _handle(stream),
    )
    return out
