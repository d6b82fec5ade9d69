"""Times met's GPU forward against plain torch on the same shapes; prints, never asserts.

Two shapes with random bf16 weights: the default model's (SmolLM2-135M) and Llama-3-8B's. For
each: decode at batch 1, 16 and 64 over a 1024-token context and a 2048-token prefill. "met" is
the forward the engine runs on a GPU (met.model.cuda_llama.CudaLlama: met's kernels for RMSNorm,
RoPE, KV append into pages, paged attention and SiLU-mul around torch matmuls; decode steps
replay CUDA graphs), timed through forward_rows, so its host-side packing and upload count;
"torch" is F.rms_norm, rotate-half, a contiguous KV cache and SDPA, its decode replayed as a
CUDA graph too. Decode bandwidth counts the bytes a step must move (weights, the KV it reads and
writes) and is shown against a measured device-to-device copy. Run through
benchmarks/gpu_check.sh, which builds met._core.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F  # noqa: N812

from met.kernels import cuda_ops as ops
from met.kernels.cuda_graphs import DecodeGraphs
from met.model.config import ModelConfig
from met.model.cuda_llama import CudaLlama
from met.model.kv_cache import PagedKvCache
from met.model.llama import LlamaModel

DTYPE = torch.bfloat16
CONTEXT = 1024  # tokens already in each decode row's cache
PREFILL = 2048
BATCHES = (1, 16, 64)
BLOCK = 16
EPS = 1e-5


def shape(name, layers, hidden, heads, kv_heads, head_dim, ffn, vocab, theta, tied):
    return ModelConfig(
        architecture="llama",
        n_layers=layers,
        n_heads=heads,
        n_kv_heads=kv_heads,
        hidden=hidden,
        head_dim=head_dim,
        ffn=ffn,
        vocab=vocab,
        rope_theta=theta,
        context_length=8192,
        norm_eps=EPS,
        tie_embeddings=tied,
    ), name


SHAPES = [
    shape("SmolLM2-135M", 30, 576, 9, 3, 64, 1536, 49152, 100000.0, True),
    shape("Llama-3-8B", 32, 4096, 32, 8, 128, 14336, 128256, 500000.0, False),
]


def random_model(c: ModelConfig) -> LlamaModel:
    """A LlamaModel (fused as the engine loads one) with random bf16 weights on the GPU."""

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=DTYPE) * 0.02

    def ones() -> torch.Tensor:
        return torch.ones(c.hidden, device="cuda", dtype=DTYPE)

    q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    weights = {"embed": w(c.vocab, c.hidden), "norm": ones()}
    if not c.tie_embeddings:
        weights["lm_head"] = w(c.vocab, c.hidden)
    for i in range(c.n_layers):
        p = f"layers.{i}."
        weights |= {
            p + "attn_norm": ones(),
            p + "wq": w(q, c.hidden),
            p + "wk": w(kv, c.hidden),
            p + "wv": w(kv, c.hidden),
            p + "wo": w(c.hidden, q),
            p + "mlp_norm": ones(),
            p + "w_gate": w(c.ffn, c.hidden),
            p + "w_up": w(c.ffn, c.hidden),
            p + "w_down": w(c.hidden, c.ffn),
        }
    return LlamaModel(c, weights, dtype=DTYPE, device="cuda")


def layer_elements(model: LlamaModel) -> int:
    return sum(t.numel() for t in model.layers[0].values() if t is not None)


def weight_bytes(model: LlamaModel) -> int:
    # A decode step reads one embedding row per token, not the table; lm_head is read whole.
    return (model.config.n_layers * layer_elements(model) + model.lm_head.numel()) * 2


class MetRows:
    """Rows for CudaLlama.forward_rows: row r owns blocks r * blocks_per_row onwards."""

    def __init__(self, blocks_per_row: int) -> None:
        self.blocks_per_row = blocks_per_row

    def table(self, row: int, tokens: int) -> list[int]:
        first = row * self.blocks_per_row
        return list(range(first, first + -(-tokens // BLOCK)))

    def decode(self, ids: torch.Tensor) -> tuple[list[list[int]], list[int], list[list[int]]]:
        batch = ids.shape[0]
        tokens = [[int(t)] for t in ids.tolist()]
        tables = [self.table(r, CONTEXT + 1) for r in range(batch)]
        return tokens, [CONTEXT] * batch, tables

    def prefill(self, ids: torch.Tensor) -> tuple[list[list[int]], list[int], list[list[int]]]:
        return [ids.tolist()], [0], [self.table(0, ids.numel())]


class TorchModel:
    """Plain torch on the same weights: contiguous [B, kv, positions, dim] cache, SDPA."""

    def __init__(self, model: LlamaModel, rows: int, positions: int) -> None:
        c = self.c = model.config
        self.model = model
        shape = (c.n_layers, rows, c.n_kv_heads, positions, c.head_dim)
        self.k = torch.zeros(shape, device="cuda", dtype=DTYPE)
        self.v = torch.zeros(shape, device="cuda", dtype=DTYPE)
        inv_freq = torch.tensor(c.inv_freq(), dtype=torch.float64)
        angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
        self.cos = angles.cos().to("cuda", DTYPE)
        self.sin = angles.sin().to("cuda", DTYPE)
        self.gqa = _sdpa_has_gqa()

    def _attend(self, q, k, v, causal):
        if not self.gqa:
            groups = self.c.n_heads // self.c.n_kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    def forward(self, ids: torch.Tensor, start: int, batch: int) -> torch.Tensor:
        """`ids` [batch, n]: n new tokens per row at positions start.. (decode: n == 1)."""
        c, m, n = self.c, self.model, ids.shape[1]
        q_w, kv_w, d = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.head_dim
        cos, sin = self.cos[start : start + n, None, :], self.sin[start : start + n, None, :]
        x = F.embedding(ids, m.embed)
        for i, w in enumerate(m.layers):
            h = F.rms_norm(x, (c.hidden,), w["attn_norm"], EPS)
            qkv = F.linear(h, w["wqkv"])
            qk = _rotate(qkv[..., : q_w + kv_w].view(batch, n, -1, d), cos, sin)
            q = qk[:, :, : c.n_heads].transpose(1, 2)
            k = qk[:, :, c.n_heads :].transpose(1, 2)
            v = qkv[..., q_w + kv_w :].view(batch, n, c.n_kv_heads, d).transpose(1, 2)
            self.k[i, :batch, :, start : start + n] = k
            self.v[i, :batch, :, start : start + n] = v
            keys = self.k[i, :batch, :, : start + n]
            values = self.v[i, :batch, :, : start + n]
            attn = self._attend(q, keys, values, causal=n > 1)
            x = x + F.linear(attn.transpose(1, 2).reshape(batch, n, q_w), w["wo"])
            h = F.rms_norm(x, (c.hidden,), w["mlp_norm"], EPS)
            gate, up = F.linear(h, w["w_gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w["w_down"])
        h = F.rms_norm(x[:, -1], (c.hidden,), m.norm, EPS)
        return F.linear(h, m.lm_head).float()


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _sdpa_has_gqa() -> bool:
    try:
        q = torch.zeros(1, 2, 1, 8, device="cuda")
        k = torch.zeros(1, 1, 1, 8, device="cuda")
        F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
        return True
    except TypeError:
        return False


def time_ms(fn, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def copy_bandwidth() -> float:
    """Bytes/s of a device-to-device copy of 2 GiB (read + write counted)."""
    src = torch.empty(2**30, dtype=DTYPE, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), 20)
    return 2 * src.numel() * 2 / (ms / 1e3)


def fill_same_kv(cache: PagedKvCache, ref: TorchModel, batch: int, blocks_per_row: int) -> None:
    """The same random context in both caches: ref's contiguous rows, met's pages."""
    c = ref.c
    for i in range(c.n_layers):
        for dense, paged in ((ref.k, cache.k), (ref.v, cache.v)):
            dense[i, :batch, :, :CONTEXT].normal_()
            pages = paged[i].view(-1, blocks_per_row, BLOCK, c.n_kv_heads, c.head_dim)
            ctx = dense[i, :batch, :, :CONTEXT].permute(0, 2, 1, 3)  # [B, pos, kv, dim]
            pages[:batch, : CONTEXT // BLOCK] = ctx.reshape(
                batch, CONTEXT // BLOCK, BLOCK, c.n_kv_heads, c.head_dim
            )


def check_shape(c: ModelConfig, name: str, copy_bw: float, iters: int) -> list[list[str]]:
    model = random_model(c)
    rows = max(BATCHES)
    blocks_per_row = max(CONTEXT + 1, PREFILL) // BLOCK + 1
    cache = model.allocate_kv_cache(rows * blocks_per_row, BLOCK)
    ref = TorchModel(model, rows, blocks_per_row * BLOCK)
    fill_same_kv(cache, ref, rows, blocks_per_row)
    began = time.time()
    met = CudaLlama(model, cache, blocks_per_row * BLOCK, rows)
    took = time.time() - began
    print(f"  {name}: decode graphs for batches {met.graph_batch_sizes} captured in {took:.1f} s")
    layout = MetRows(blocks_per_row)

    probe = torch.randint(0, c.vocab, (min(16, rows),), device="cuda")
    got, _ = met.forward_rows(*layout.decode(probe))
    want = ref.forward(probe[:, None], CONTEXT, probe.numel())
    err = float((got - want).abs().max() / want.abs().max())
    nan = "  NaN in met logits!" if torch.isnan(got).any() else ""
    print(f"  {name}: decode logits met vs torch, max |diff| / max |logit| = {err:.2e}{nan}")
    out = [_decode_row(name, model, met, ref, layout, batch, copy_bw, iters) for batch in BATCHES]
    return out + [_prefill_row(name, model, met, ref, layout, iters)]


def _decode_row(name, model, met, ref, layout, batch, copy_bw, iters) -> list[str]:
    c = model.config
    ids = torch.randint(0, c.vocab, (batch,), device="cuda")
    step = layout.decode(ids)
    met_ms = time_ms(lambda: met.forward_rows(*step), iters)
    torch_ms = _graphed_torch_decode(ref, ids[:, None].clone(), batch, iters)
    kv_step = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 2  # K and V bytes per token per step
    moved = weight_bytes(model) + batch * (CONTEXT + 1) * kv_step
    met_bw, torch_bw = moved / (met_ms / 1e3), moved / (torch_ms / 1e3)
    return [
        name,
        f"decode b={batch}",
        f"{met_ms:.3f}",
        f"{torch_ms:.3f}",
        f"{met_bw / 1e9:.0f} ({100 * met_bw / copy_bw:.0f}%)",
        f"{torch_bw / 1e9:.0f} ({100 * torch_bw / copy_bw:.0f}%)",
        f"{torch_ms / met_ms:.2f}x",
    ]


def _prefill_row(name, model, met, ref, layout, iters) -> list[str]:
    c = model.config
    ids = torch.randint(0, c.vocab, (PREFILL,), device="cuda")
    prefill = layout.prefill(ids)
    met_ms = time_ms(lambda: met.forward_rows(*prefill), max(2, iters // 10), 1)
    torch_ms = time_ms(lambda: ref.forward(ids[None], 0, 1), max(2, iters // 10), 1)
    attention = 4 * c.n_layers * c.n_heads * c.head_dim * PREFILL * PREFILL / 2  # causal QK^T, PV
    params = c.n_layers * layer_elements(model)
    flops = 2 * params * PREFILL + 2 * model.lm_head.numel() + attention
    return [
        name,
        f"prefill {PREFILL}",
        f"{met_ms:.2f}",
        f"{torch_ms:.2f}",
        f"{flops / (met_ms / 1e3) / 1e12:.0f} TFLOP/s",
        f"{flops / (torch_ms / 1e3) / 1e12:.0f} TFLOP/s",
        f"{torch_ms / met_ms:.2f}x",
    ]


def _graphed_torch_decode(ref: TorchModel, ids: torch.Tensor, batch: int, iters: int) -> float:
    graphs = DecodeGraphs(
        lambda b: ref.forward(b["ids"], CONTEXT, batch),
        lambda _: {"ids": ids},
        pad={},
        batch_sizes=(batch,),
    )
    return time_ms(lambda: graphs.run({"ids": ids}), iters)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    if not ops.available():
        print("gpu_check: needs a GPU and met._core built with CUDA", file=sys.stderr)
        return 2
    iters = 10 if args.quick else 50
    began = time.time()
    props = torch.cuda.get_device_properties(0)
    copy_bw = copy_bandwidth()
    print(f"device: {props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__}")
    print(f"device-to-device copy: {copy_bw / 1e9:.0f} GB/s (read + write)")
    header = [
        "model",
        "step",
        "met ms",
        "torch ms",
        "met GB/s (of copy)",
        "torch GB/s (of copy)",
        "met speedup",
    ]
    table = [header]
    for config, name in SHAPES:
        table += check_shape(config, name, copy_bw, iters)
        torch.cuda.empty_cache()  # the shape's weights, caches and graphs are gone by now
    widths = [max(len(row[c]) for row in table) for c in range(len(header))]
    for row in table:
        print(
            "  ".join(
                cell.rjust(w) if c > 1 else cell.ljust(w)
                for c, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    print(
        f"prefill rows show TFLOP/s instead of GB/s; {time.time() - began:.0f} s, "
        f"decode context {CONTEXT}, KV block {BLOCK}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
