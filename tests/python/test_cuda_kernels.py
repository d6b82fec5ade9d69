"""met's CUDA kernels against torch references on the GPU (skipped without one).

Tolerances (|got - want| <= atol + rtol * |want|, references computed in float32 or float64
from the same rounded inputs): float32 2e-4/2e-4 (accumulation order), float16 4e-3/4e-3 and
bfloat16 2e-2/2e-2 (one output rounding, 2^-11 and 2^-8, plus the reference's own). Every
comparison also fails on a NaN anywhere in the output.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from met import _core

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
    pytest.mark.skipif(not _core.has_cuda(), reason="met._core was built without CUDA"),
]

TOL = {torch.float32: 2e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}
DTYPES = list(TOL)
DEV = "cuda"


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert not torch.isnan(got).any(), "NaN in the kernel output"
    tol = TOL[got.dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol, equal_nan=False)


def _ops():
    from met.kernels import cuda_ops

    return cuda_ops


def _paged(rng, ctx, num_blocks, block_size, n_kv, dim, dtype, max_blocks):
    """Random per-row K/V written over shuffled blocks; returns caches, tables and dense K/V."""
    k_cache = torch.zeros(num_blocks, block_size, n_kv, dim, dtype=dtype, device=DEV)
    v_cache = torch.zeros_like(k_cache)
    order = torch.randperm(num_blocks, generator=rng)
    tables = torch.zeros(len(ctx), max_blocks, dtype=torch.int32)
    dense = []
    used = 0
    for b, n in enumerate(ctx):
        need = -(-n // block_size)
        tables[b, :need] = order[used : used + need].int()
        used += need
        k = torch.randn(n, n_kv, dim, generator=rng).to(dtype).to(DEV)
        v = torch.randn(n, n_kv, dim, generator=rng).to(dtype).to(DEV)
        pos = torch.arange(n)
        slots = (tables[b, pos // block_size].long() * block_size + pos % block_size).to(DEV)
        k_cache.view(-1, n_kv, dim)[slots] = k
        v_cache.view(-1, n_kv, dim)[slots] = v
        dense.append((k, v))
    return k_cache, v_cache, tables.to(DEV), dense


def _attention_ref(q, dense, ctx, q_lens, groups):
    out = torch.zeros(q.shape, dtype=torch.float32, device=DEV)
    start = 0
    for (k, v), n, q_len in zip(dense, ctx, q_lens, strict=True):
        if q_len and n:
            qs = q[start : start + q_len].float().transpose(0, 1)  # [heads, q, dim]
            keys = k.float().repeat_interleave(groups, dim=1).transpose(0, 1)
            values = v.float().repeat_interleave(groups, dim=1).transpose(0, 1)
            query_pos = torch.arange(n - q_len, n, device=DEV)
            mask = torch.arange(n, device=DEV)[None, :] <= query_pos[:, None]
            o = F.scaled_dot_product_attention(qs, keys, values, attn_mask=mask)
            out[start : start + q_len] = o.transpose(0, 1)
        start += q_len
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("n_heads", "n_kv", "dim"), [(8, 8, 64), (9, 3, 64), (32, 8, 128), (16, 2, 256)]
)
def test_paged_attention_mixed_rows(dtype, n_heads, n_kv, dim):
    """A fresh prefill, a chunk over earlier context, decode rows and an empty padding row."""
    rng = torch.Generator().manual_seed(0)
    block_size, max_blocks = 16, 8
    ctx, q_lens = [37, 100, 64, 1, 0], [37, 20, 1, 1, 1]
    k_cache, v_cache, tables, dense = _paged(rng, ctx, 64, block_size, n_kv, dim, dtype, max_blocks)
    q = torch.randn(sum(q_lens), n_heads, dim, generator=rng).to(dtype).to(DEV)
    cu = torch.tensor(np.cumsum([0, *q_lens]), dtype=torch.int32, device=DEV)
    lens = torch.tensor(ctx, dtype=torch.int32, device=DEV)
    got = _ops().paged_attention(q, k_cache, v_cache, tables, lens, cu, max(q_lens), max(ctx))
    _close(got, _attention_ref(q, dense, ctx, q_lens, n_heads // n_kv))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 3, 64])
def test_paged_attention_split_decode(dtype, batch):
    """Decode with long contexts and a graph-style capacity bound: rows split over CTAs."""
    rng = torch.Generator().manual_seed(batch)
    n_heads, n_kv, dim, block_size, max_blocks = 32, 8, 128, 16, 160
    ctx = [int(x) for x in torch.randint(1, 2500, (batch,), generator=rng)]
    k_cache, v_cache, tables, dense = _paged(
        rng, ctx, batch * max_blocks, block_size, n_kv, dim, dtype, max_blocks
    )
    q = torch.randn(batch, n_heads, dim, generator=rng).to(dtype).to(DEV)
    cu = torch.arange(batch + 1, dtype=torch.int32, device=DEV)
    lens = torch.tensor(ctx, dtype=torch.int32, device=DEV)
    got = _ops().paged_attention(q, k_cache, v_cache, tables, lens, cu, 1, max_blocks * block_size)
    _close(got, _attention_ref(q, dense, ctx, [1] * batch, n_heads // n_kv))


def test_paged_attention_reads_q_from_a_fused_qkv_row():
    rng = torch.Generator().manual_seed(3)
    n_heads, n_kv, dim = 8, 2, 64
    k_cache, v_cache, tables, dense = _paged(rng, [50], 8, 16, n_kv, dim, torch.bfloat16, 4)
    qkv = torch.randn(1, (n_heads + 2 * n_kv) * dim, generator=rng).bfloat16().to(DEV)
    q = qkv[:, : n_heads * dim].view(1, n_heads, dim)
    args = (
        tables,
        torch.tensor([50], dtype=torch.int32, device=DEV),
        torch.tensor([0, 1], dtype=torch.int32, device=DEV),
        1,
        64,
    )
    got = _ops().paged_attention(q, k_cache, v_cache, *args)
    want = _ops().paged_attention(q.contiguous(), k_cache, v_cache, *args)
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_append_matches_index_copy(dtype):
    n_kv, dim, block_size = 4, 64, 16
    k_cache = torch.randn(10, block_size, n_kv, dim, device=DEV).to(dtype)
    v_cache = torch.randn_like(k_cache)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    kv = torch.randn(7, 2 * n_kv * dim + 64, device=DEV).to(dtype)  # rows with extra columns
    k = kv[:, : n_kv * dim].view(7, n_kv, dim)
    v = kv[:, n_kv * dim : 2 * n_kv * dim].view(7, n_kv, dim)
    slots = torch.tensor([3, 17, -1, 40, 159, 0, 88], device=DEV)
    _ops().kv_append(k_cache, v_cache, k, v, slots)
    keep = slots >= 0
    want_k.view(-1, n_kv, dim).index_copy_(0, slots[keep], k[keep])
    want_v.view(-1, n_kv, dim).index_copy_(0, slots[keep], v[keep])
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [576, 4096, 5000])
def test_rms_norm(dtype, hidden):
    x = (3 * torch.randn(33, hidden, device=DEV)).to(dtype)
    w = torch.randn(hidden, device=DEV).to(dtype)
    want = F.rms_norm(x.float(), (hidden,), w.float(), 1e-5)
    _close(_ops().rms_norm(x, w, 1e-5), want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_on_a_qkv_view(dtype):
    n_heads, n_kv, dim, n_tok = 8, 2, 128, 19
    ops = _ops()
    inv_freq = [500000.0 ** (-2.0 * i / dim) for i in range(dim // 2)]
    cos, sin = ops.rope_tables(inv_freq, 4096, DEV)
    qkv = torch.randn(n_tok, (n_heads + 2 * n_kv) * dim, device=DEV).to(dtype)
    before = qkv.clone()
    positions = torch.randint(0, 4096, (n_tok,), device=DEV)
    qk = qkv[:, : (n_heads + n_kv) * dim].view(n_tok, n_heads + n_kv, dim)
    ops.rope_(qk, positions, cos, sin)
    x = before[:, : (n_heads + n_kv) * dim].view(n_tok, -1, dim).double()
    c, s = cos[positions][:, None, :].double(), sin[positions][:, None, :].double()
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    want = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    _close(qk, want)
    assert torch.equal(qkv[:, (n_heads + n_kv) * dim :], before[:, (n_heads + n_kv) * dim :])


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype):
    x = (2 * torch.randn(9, 2 * 1536, device=DEV)).to(dtype)
    gate, up = x.chunk(2, dim=-1)
    _close(_ops().silu_mul(x), F.silu(gate) * up)


def test_argmax_matches_torch_and_takes_nan():
    logits = torch.randn(70, 128256, device=DEV)
    logits[5, 77] = float("nan")
    logits[6] = float("-inf")
    want = logits.argmax(dim=-1).int()
    want[6] = 0
    assert torch.equal(_ops().argmax(logits), want)


def _sample_case(rows, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(rows, vocab, generator=g)
    params = {
        "temperature": torch.rand(rows, generator=g) * 1.5,
        "top_k": torch.randint(0, 60, (rows,), generator=g).int(),
        "top_p": torch.where(
            torch.rand(rows, generator=g) < 0.5, 1.0, torch.rand(rows, generator=g)
        ),
        "min_p": torch.where(
            torch.rand(rows, generator=g) < 0.5, 0.0, 0.2 * torch.rand(rows, generator=g)
        ),
        "seed": torch.randint(0, 2**62, (rows,), generator=g),
        "step": torch.randint(0, 1000, (rows,), generator=g),
    }
    params["temperature"][:4] = 0.0  # a few greedy rows
    return logits, params


def test_sample_matches_cpu_reference_draw_for_draw():
    logits, params = _sample_case(256, 32000, 0)
    got = _ops().sample(logits.to(DEV), **{k: v.to(DEV) for k, v in params.items()}).cpu()
    want = _core.kernel_refs.sample(
        logits.numpy(),
        *(params[k].numpy() for k in ("temperature", "top_k", "top_p", "min_p")),
        params["seed"].numpy().astype(np.uint64),
        params["step"].numpy().astype(np.uint64),
    )
    # Equal but for a float-summation tie at a top-p boundary (expected: none in 256 rows).
    assert (got.numpy() != want).sum() <= 1
    greedy = params["temperature"] <= 0
    assert torch.equal(got[greedy], logits[greedy].argmax(dim=-1).int())


def test_sample_is_reproducible_and_respects_the_cut():
    logits, params = _sample_case(64, 50000, 1)
    logits, params = logits.to(DEV), {k: v.to(DEV) for k, v in params.items()}
    params["temperature"].fill_(1.0)
    params["top_k"].fill_(5)
    first = _ops().sample(logits, **params)
    assert torch.equal(first, _ops().sample(logits, **params))
    top5 = logits.topk(5, dim=-1).indices
    assert (top5 == first.long()[:, None]).any(dim=-1).all()
    params["step"] += 1
    assert not torch.equal(first, _ops().sample(logits, **params))  # a new draw every step


def test_stream_set_orders_prefill_before_decode_by_the_event():
    from met.kernels.cuda_streams import CudaStreams

    streams = CudaStreams(0)
    decode, prefill = streams.torch_stream(0), streams.torch_stream(1)
    assert decode.cuda_stream != prefill.cuda_stream
    assert (streams.create_stream(), streams.create_event()) == (1, 2)
    x = torch.zeros(4096, 4096, device=DEV)
    torch.cuda.synchronize()
    with streams.use(1):
        for _ in range(20):  # long enough that an unordered reader would see zeros
            x = x + 1
        done = x
    streams.record_event(2, 1)
    streams.stream_wait_event(0, 2)
    with streams.use(0):
        seen = torch.stack([done.amin(), done.amax()])
    streams.synchronize(0)
    assert seen.tolist() == [20.0, 20.0]


def test_decode_graphs_replay_with_padding():
    from met.kernels.cuda_graphs import DecodeGraphs

    ops = _ops()
    weight = torch.randn(256, device=DEV)

    def forward(buf):
        return ops.argmax(ops.rms_norm(buf["x"], weight, 1e-6))

    def make_buffers(size):
        return {"x": torch.zeros(size, 256, device=DEV)}

    graphs = DecodeGraphs(forward, make_buffers, pad={"x": 0.0}, batch_sizes=(1, 2, 4))
    assert graphs.batch_sizes == [1, 2, 4] and graphs.size_for(3) == 4
    assert graphs.size_for(5) is None
    for n in (1, 3, 4):
        x = torch.randn(n, 256, device=DEV)
        assert torch.equal(graphs.run({"x": x}), forward({"x": x}))
