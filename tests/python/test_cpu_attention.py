"""_core.cpu.paged_attention against torch's scaled_dot_product_attention per row's context."""

import math

import pytest
import torch

from met import _core
from met.model.sinks import with_sink_column

# The kernel sums scores in fp32, rounds V and its softmax weights to bf16 and sums their exact
# products in fp32 (csrc/cpu/attention_item.inc). The reference rounds V the same way and runs
# float64 SDPA, so what is left is the weights' rounding: each weight off by at most 2^-9
# relative moves an output element by at most 2^-8 times the largest |value| of the context
# (the normalization takes back the common part), plus fp32 sums (under 1e-5 here).
WEIGHT_ROUNDING = 1.01 / 256
TOLERANCE = 1e-5
LOG2E = 1.4426950408889634
# Every test here runs once per kernel path this CPU supports (conftest.cpu_path).
pytestmark = pytest.mark.usefixtures("cpu_path")


def _pool(rows, n_heads, n_kv_heads, head_dim, block_size, seed):
    """rows: (context before this step, q_len) per row. K/V on shuffled blocks, NaN elsewhere."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [ctx + q_len for ctx, q_len in rows]
    n_blocks_per_row = [math.ceil(n / block_size) for n in seq_lens]
    n_blocks = sum(n_blocks_per_row) + 2
    ids = torch.randperm(n_blocks, generator=gen).to(torch.int32)
    stride = max(n_blocks_per_row)
    tables = torch.full((len(rows), stride), -1, dtype=torch.int32)
    k_cache = torch.full((n_blocks, block_size, n_kv_heads, head_dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    start = 0
    for b, (n, used) in enumerate(zip(seq_lens, n_blocks_per_row, strict=True)):
        tables[b, :used] = ids[start : start + used]
        start += used
        for p in range(n):
            block, offset = int(tables[b, p // block_size]), p % block_size
            k_cache[block, offset] = torch.randn(n_kv_heads, head_dim, generator=gen)
            v_cache[block, offset] = torch.randn(n_kv_heads, head_dim, generator=gen)
    total = sum(q_len for _, q_len in rows)
    q = 2.0 * torch.randn(total, n_heads, head_dim, generator=gen)
    cu = torch.tensor(
        [0] + [sum(r[1] for r in rows[: i + 1]) for i in range(len(rows))], dtype=torch.int32
    )
    return q, k_cache, v_cache, cu, torch.tensor(seq_lens, dtype=torch.int32), tables


def _attention(q, k_cache, v_cache, cu, seq_lens, tables, n_threads=0, window=0, sinks=None):
    """Over an fp32 pool, or an fp16 one (read as kv_half); sinks: [n_heads] fp32 or None."""
    total, n_heads, head_dim = q.shape
    _, block_size, n_kv_heads, _ = k_cache.shape
    out = torch.full((total, n_heads * head_dim), float("nan"))
    _core.cpu.paged_attention(
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        out.data_ptr(),
        len(seq_lens),
        cu.data_ptr(),
        seq_lens.data_ptr(),
        tables.data_ptr(),
        tables.shape[1],
        n_heads,
        n_kv_heads,
        head_dim,
        block_size,
        1.0 / math.sqrt(head_dim),
        n_threads,
        kv_half=k_cache.dtype == torch.float16,
        window=window,
        sinks_ptr=0 if sinks is None else sinks.data_ptr(),
    )
    return out


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.float().to(torch.bfloat16).double()


def _reference(q, k_cache, v_cache, cu, seq_lens, tables, window=0, sinks=None):
    """Per row: gather the context, repeat kv heads for GQA, causal mask (and the sliding window
    when set), float64 SDPA over the kernel's bf16 values (scores in log2 units, as the kernel's),
    each head's sink as the torch forward adds it (met.model.sinks). Returns the output and each
    element's tolerance."""
    total, n_heads, head_dim = q.shape
    block_size, n_kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty(total, n_heads * head_dim, dtype=torch.float64)
    bound = torch.empty_like(out)
    q_scale = torch.tensor(1.0 / math.sqrt(head_dim), dtype=torch.float32) * torch.tensor(
        LOG2E, dtype=torch.float32
    )
    for b in range(len(seq_lens)):
        n, first, last = int(seq_lens[b]), int(cu[b]), int(cu[b + 1])
        q_len = last - first
        positions = torch.arange(n)
        blocks = tables[b, positions // block_size].long()
        keys = k_cache[blocks, positions % block_size].double()  # [n, n_kv_heads, head_dim]
        values = _bf16(v_cache[blocks, positions % block_size])
        group = n_heads // n_kv_heads
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # [n_heads, n, head_dim]
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        query = (q[first:last] * q_scale).double().transpose(0, 1)  # [n_heads, q_len, head_dim]
        query_pos = torch.arange(n - q_len, n)
        mask = positions[None, :] <= query_pos[:, None]
        if window:
            mask &= positions[None, :] > query_pos[:, None] - window
        if sinks is not None:
            additive = torch.zeros(mask.shape, dtype=torch.float64).masked_fill_(~mask, -math.inf)
            row_sinks = sinks.double()[:, None].expand(n_heads, q_len)
            keys, values, mask = with_sink_column(keys, values, additive, row_sinks)
        o = torch.nn.functional.scaled_dot_product_attention(
            query, keys, values, attn_mask=mask, scale=math.log(2.0)
        )
        out[first:last] = o.transpose(0, 1).reshape(q_len, n_heads * head_dim)
        largest = values.abs().amax(dim=1).reshape(1, n_heads * head_dim)  # over the context
        bound[first:last] = TOLERANCE + WEIGHT_ROUNDING * largest
    return out, bound


def _assert_close(got: torch.Tensor, want_and_bound: tuple[torch.Tensor, torch.Tensor]) -> None:
    want, bound = want_and_bound
    assert torch.isfinite(got).all()
    excess = (got.double() - want).abs() - bound
    assert excess.max() <= 0, f"off by up to {excess.max().item():.3g} past the bound"


# A decode row, a prefill from position 0, a continuation chunk, the very first token, a decode
# that fills a block exactly, and a long continuation.
ROWS = [(99, 1), (0, 37), (20, 13), (0, 1), (15, 1), (150, 80)]


@pytest.mark.parametrize(
    "n_heads,n_kv_heads,head_dim", [(9, 3, 64), (4, 4, 64), (8, 8, 128), (6, 2, 128)]
)
@pytest.mark.parametrize("n_threads", [0, 2])
def test_matches_sdpa(n_heads: int, n_kv_heads: int, head_dim: int, n_threads: int) -> None:
    batch = _pool(ROWS, n_heads, n_kv_heads, head_dim, 16, seed=head_dim + n_heads)
    _assert_close(_attention(*batch, n_threads=n_threads), _reference(*batch))


@pytest.mark.parametrize("window", [1, 6, 16, 21, 120])
@pytest.mark.parametrize("n_threads", [0, 2])
def test_a_sliding_window_matches_sdpa_with_the_window_mask(window: int, n_threads: int) -> None:
    batch = _pool(ROWS, 9, 3, 64, 16, seed=window)
    got = _attention(*batch, n_threads=n_threads, window=window)
    _assert_close(got, _reference(*batch, window=window))
    # The window changes the answer wherever a query has more keys than it (the last: 230).
    assert not torch.allclose(got[-1].double(), _reference(*batch)[0][-1], atol=0.05)


def test_rejects_a_negative_window() -> None:
    with pytest.raises(ValueError, match="window"):
        _core.cpu.paged_attention(0, 0, 0, 0, 0, 0, 0, 0, 1, 9, 3, 64, 16, 0.125, 0, window=-1)


def test_batch_invariant_bits() -> None:
    # One sequence of 40 tokens prefilled in one row; each token again as a decode row alone and
    # among other rows, on one and two threads: the same bits every time.
    q, k_cache, v_cache, cu, seq_lens, tables = _pool([(0, 40)], 9, 3, 64, 16, seed=1)
    prefill = _attention(q, k_cache, v_cache, cu, seq_lens, tables)
    for pos in (0, 15, 16, 39):
        one = torch.tensor([0, 1], dtype=torch.int32)
        alone = _attention(
            q[pos : pos + 1].contiguous(),
            k_cache,
            v_cache,
            one,
            torch.tensor([pos + 1], dtype=torch.int32),
            tables,
        )
        assert torch.equal(alone[0], prefill[pos])
    # The same prefill row next to decode rows of the same sequence at other positions.
    mixed_q = torch.cat([q[7:8], q, q[30:31]])
    mixed_cu = torch.tensor([0, 1, 41, 42], dtype=torch.int32)
    mixed_lens = torch.tensor([8, 40, 31], dtype=torch.int32)
    mixed_tables = tables.repeat(3, 1)
    for n_threads in (0, 1, 2):
        mixed = _attention(mixed_q, k_cache, v_cache, mixed_cu, mixed_lens, mixed_tables, n_threads)
        assert torch.equal(mixed[1:41], prefill)
        assert torch.equal(mixed[0], prefill[7]) and torch.equal(mixed[41], prefill[30])


def test_rejects_bad_head_counts() -> None:
    with pytest.raises(ValueError, match="multiple"):
        _core.cpu.paged_attention(0, 0, 0, 0, 0, 0, 0, 0, 1, 9, 2, 64, 16, 0.125, 0)


def test_an_fp16_pool_gives_the_bits_of_an_fp32_pool_holding_the_same_values() -> None:
    q, k_cache, v_cache, cu, seq_lens, tables = _pool([(0, 37), (50, 1), (20, 9)], 9, 3, 64, 16, 4)
    half_k, half_v = k_cache.half(), v_cache.half()
    want = _attention(q, half_k.float(), half_v.float(), cu, seq_lens, tables)
    for threads in (0, 2):
        got = _attention(q, half_k, half_v, cu, seq_lens, tables, threads)
        assert torch.equal(got, want)


@pytest.mark.parametrize("window", [0, 6])
@pytest.mark.parametrize("n_threads", [0, 2])
def test_sinks_match_sdpa_with_the_sink_column(window: int, n_threads: int) -> None:
    # gpt-oss: a logit per query head in the softmax denominator, below, about and above the
    # scores (2.0 * randn queries); decode rows keep their prefill bits.
    batch = _pool(ROWS, 9, 3, 64, 16, seed=window + 7)
    sinks = torch.tensor([-4.0, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 9.0])
    got = _attention(*batch, n_threads=n_threads, window=window, sinks=sinks)
    _assert_close(got, _reference(*batch, window=window, sinks=sinks))
    plain = _attention(*batch, n_threads=n_threads, window=window)
    assert not torch.allclose(got, plain, atol=1e-3)
