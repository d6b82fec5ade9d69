"""Times met's GPU path against plain torch on the same shapes; prints, never asserts.

Two shapes with random bf16 weights: the default model's (SmolLM2-135M) and Llama-3-8B's. For
each: decode at batch 1, 16 and 64 over a 1024-token context (both sides replayed as CUDA
graphs, so the figures compare kernels, not Python), and a 2048-token prefill (eager). "met" is
met's kernels (RMSNorm, RoPE, KV append into pages, paged attention, SiLU-mul) around torch
matmuls; "torch" is F.rms_norm, rotate-half, a contiguous KV cache and SDPA. Decode bandwidth
counts the bytes a step must move (weights, the KV it reads and writes) and is shown against a
measured device-to-device copy. Run through benchmarks/gpu_check.sh, which builds met._core.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812

from met.kernels import cuda_ops as ops
from met.kernels.cuda_graphs import DecodeGraphs

DTYPE = torch.bfloat16
CONTEXT = 1024  # tokens already in each decode row's cache
PREFILL = 2048
BATCHES = (1, 16, 64)
BLOCK = 16
EPS = 1e-5


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    theta: float
    tied: bool


SHAPES = [
    Shape("SmolLM2-135M", 30, 576, 9, 3, 64, 1536, 49152, 100000.0, True),
    Shape("Llama-3-8B", 32, 4096, 32, 8, 128, 14336, 128256, 500000.0, False),
]


def random_weights(s: Shape) -> dict:
    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=DTYPE) * 0.02

    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    layers = [
        {
            "attn_norm": torch.ones(s.hidden, device="cuda", dtype=DTYPE),
            "wqkv": w(q + 2 * kv, s.hidden),
            "wo": w(s.hidden, q),
            "mlp_norm": torch.ones(s.hidden, device="cuda", dtype=DTYPE),
            "w_gate_up": w(2 * s.ffn, s.hidden),
            "w_down": w(s.hidden, s.ffn),
        }
        for _ in range(s.layers)
    ]
    embed = w(s.vocab, s.hidden)
    lm_head = embed if s.tied else w(s.vocab, s.hidden)
    norm = torch.ones(s.hidden, device="cuda", dtype=DTYPE)
    return {"layers": layers, "embed": embed, "lm_head": lm_head, "norm": norm}


def weight_bytes(wts: dict, s: Shape) -> int:
    per_layer = sum(t.numel() for t in wts["layers"][0].values()) * 2
    # A decode step reads one embedding row per token, not the table; lm_head is read whole.
    return s.layers * per_layer + wts["lm_head"].numel() * 2


class MetModel:
    """The forward the torch backend would run on CUDA with met's kernels and paged KV."""

    def __init__(self, s: Shape, wts: dict, rows: int, blocks_per_row: int) -> None:
        self.s, self.w = s, wts
        self.blocks_per_row = blocks_per_row
        shape = (s.layers, rows * blocks_per_row, BLOCK, s.kv_heads, s.head_dim)
        self.k = torch.zeros(shape, device="cuda", dtype=DTYPE)
        self.v = torch.zeros(shape, device="cuda", dtype=DTYPE)
        inv_freq = [s.theta ** (-2.0 * i / s.head_dim) for i in range(s.head_dim // 2)]
        self.cos, self.sin = ops.rope_tables(inv_freq, blocks_per_row * BLOCK, "cuda")

    def forward(self, b: dict, max_query_len: int, max_seq_len: int) -> torch.Tensor:
        s, n = self.s, b["ids"].shape[0]
        q_w, kv_w = s.heads * s.head_dim, s.kv_heads * s.head_dim
        x = F.embedding(b["ids"], self.w["embed"])
        for i, w in enumerate(self.w["layers"]):
            qkv = F.linear(ops.rms_norm(x, w["attn_norm"], EPS), w["wqkv"])
            ops.rope_(qkv[:, : q_w + kv_w].view(n, -1, s.head_dim), b["pos"], self.cos, self.sin)
            k = qkv[:, q_w : q_w + kv_w].view(n, s.kv_heads, s.head_dim)
            v = qkv[:, q_w + kv_w :].view(n, s.kv_heads, s.head_dim)
            ops.kv_append(self.k[i], self.v[i], k, v, b["slots"])
            q = qkv[:, :q_w].view(n, s.heads, s.head_dim)
            attn = ops.paged_attention(
                q,
                self.k[i],
                self.v[i],
                b["tables"],
                b["lens"],
                b["cu"],
                max_query_len,
                max_seq_len,
            )
            x = x + F.linear(attn.view(n, q_w), w["wo"])
            h = F.linear(ops.rms_norm(x, w["mlp_norm"], EPS), w["w_gate_up"])
            x = x + F.linear(ops.silu_mul(h), w["w_down"])
        h = ops.rms_norm(x[b["rows"]].contiguous(), self.w["norm"], EPS)
        return F.linear(h, self.w["lm_head"]).float()

    def decode_inputs(self, batch: int) -> dict:
        rows = torch.arange(batch, device="cuda")
        table = rows[:, None] * self.blocks_per_row + torch.arange(
            self.blocks_per_row, device="cuda"
        )
        slot = table[:, CONTEXT // BLOCK] * BLOCK + CONTEXT % BLOCK
        i32 = torch.int32
        return {
            "ids": torch.randint(0, self.s.vocab, (batch,), device="cuda"),
            "pos": torch.full((batch,), CONTEXT, device="cuda"),
            "slots": slot,
            "tables": table.to(i32),
            "lens": torch.full((batch,), CONTEXT + 1, device="cuda", dtype=i32),
            "cu": torch.arange(batch + 1, device="cuda", dtype=i32),
            "rows": rows,
        }

    def prefill_inputs(self, n: int) -> dict:
        pos = torch.arange(n, device="cuda")
        table = torch.arange(self.blocks_per_row, device="cuda")
        i32 = torch.int32
        return {
            "ids": torch.randint(0, self.s.vocab, (n,), device="cuda"),
            "pos": pos,
            "slots": table[pos // BLOCK] * BLOCK + pos % BLOCK,
            "tables": table[None].to(i32),
            "lens": torch.tensor([n], device="cuda", dtype=i32),
            "cu": torch.tensor([0, n], device="cuda", dtype=i32),
            "rows": torch.tensor([n - 1], device="cuda"),
        }


class TorchModel:
    """Plain torch on the same weights: contiguous [B, kv, positions, dim] cache, SDPA."""

    def __init__(self, s: Shape, wts: dict, rows: int, positions: int) -> None:
        self.s, self.w = s, wts
        shape = (s.layers, rows, s.kv_heads, positions, s.head_dim)
        self.k = torch.zeros(shape, device="cuda", dtype=DTYPE)
        self.v = torch.zeros(shape, device="cuda", dtype=DTYPE)
        inv_freq = torch.tensor(
            [s.theta ** (-2.0 * i / s.head_dim) for i in range(s.head_dim // 2)],
            dtype=torch.float64,
        )
        angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
        self.cos = angles.cos().to("cuda", DTYPE)
        self.sin = angles.sin().to("cuda", DTYPE)
        self.gqa = _sdpa_has_gqa()

    def _attend(self, q, k, v, causal):
        if not self.gqa:
            groups = self.s.heads // self.s.kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    def forward(self, ids: torch.Tensor, start: int, batch: int) -> torch.Tensor:
        """`ids` [batch, n]: n new tokens per row at positions start.. (decode: n == 1)."""
        s, n = self.s, ids.shape[1]
        q_w, kv_w, d = s.heads * s.head_dim, s.kv_heads * s.head_dim, s.head_dim
        cos, sin = self.cos[start : start + n, None, :], self.sin[start : start + n, None, :]
        x = F.embedding(ids, self.w["embed"])
        for i, w in enumerate(self.w["layers"]):
            h = F.rms_norm(x, (s.hidden,), w["attn_norm"], EPS)
            qkv = F.linear(h, w["wqkv"])
            qk = _rotate(qkv[..., : q_w + kv_w].view(batch, n, -1, d), cos, sin)
            q = qk[:, :, : s.heads].transpose(1, 2)
            k = qk[:, :, s.heads :].transpose(1, 2)
            v = qkv[..., q_w + kv_w :].view(batch, n, s.kv_heads, d).transpose(1, 2)
            self.k[i, :batch, :, start : start + n] = k
            self.v[i, :batch, :, start : start + n] = v
            keys = self.k[i, :batch, :, : start + n]
            values = self.v[i, :batch, :, : start + n]
            attn = self._attend(q, keys, values, causal=n > 1)
            x = x + F.linear(attn.transpose(1, 2).reshape(batch, n, q_w), w["wo"])
            h = F.rms_norm(x, (s.hidden,), w["mlp_norm"], EPS)
            gate, up = F.linear(h, w["w_gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w["w_down"])
        h = F.rms_norm(x[:, -1], (s.hidden,), self.w["norm"], EPS)
        return F.linear(h, self.w["lm_head"]).float()


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


def fill_same_kv(met: MetModel, ref: TorchModel, batch: int, blocks_per_row: int) -> None:
    """The same random context in both caches: ref's contiguous rows, met's pages."""
    s = met.s
    for i in range(s.layers):
        for cache, paged in ((ref.k, met.k), (ref.v, met.v)):
            cache[i, :batch, :, :CONTEXT].normal_()
            pages = paged[i].view(-1, blocks_per_row, BLOCK, s.kv_heads, s.head_dim)
            ctx = cache[i, :batch, :, :CONTEXT].permute(0, 2, 1, 3)  # [B, pos, kv, dim]
            pages[:batch, : CONTEXT // BLOCK] = ctx.reshape(
                batch, CONTEXT // BLOCK, BLOCK, s.kv_heads, s.head_dim
            )


def check_shape(s: Shape, copy_bw: float, iters: int) -> list[list[str]]:
    wts = random_weights(s)
    rows = max(BATCHES)
    blocks_per_row = max(CONTEXT + 1, PREFILL) // BLOCK + 1
    met = MetModel(s, wts, rows, blocks_per_row)
    ref = TorchModel(s, wts, rows, blocks_per_row * BLOCK)
    fill_same_kv(met, ref, rows, blocks_per_row)
    capacity = blocks_per_row * BLOCK
    out = []

    probe = met.decode_inputs(16)
    got = met.forward(probe, 1, capacity)
    want = ref.forward(probe["ids"][:, None], CONTEXT, 16)
    err = float((got - want).abs().max() / want.abs().max())
    nan = bool(torch.isnan(got).any())
    print(
        f"  {s.name}: decode logits met vs torch, max |diff| / max |logit| = {err:.2e}"
        f"{'  NaN in met logits!' if nan else ''}"
    )

    met_graphs = DecodeGraphs(
        lambda b: met.forward(b, 1, capacity),
        met.decode_inputs,
        pad={},
        batch_sizes=BATCHES,
    )
    kv_step = 2 * s.layers * s.kv_heads * s.head_dim * 2  # K and V bytes per token per step
    for batch in BATCHES:
        inputs = met.decode_inputs(batch)
        met_ms = time_ms(lambda inputs=inputs: met_graphs.run(inputs), iters)
        ids = inputs["ids"][:, None].clone()
        torch_ms = _graphed_torch_decode(ref, ids, batch, iters)
        moved = weight_bytes(wts, s) + batch * (CONTEXT + 1) * kv_step
        met_bw, torch_bw = moved / (met_ms / 1e3), moved / (torch_ms / 1e3)
        out.append(
            [
                s.name,
                f"decode b={batch}",
                f"{met_ms:.3f}",
                f"{torch_ms:.3f}",
                f"{met_bw / 1e9:.0f} ({100 * met_bw / copy_bw:.0f}%)",
                f"{torch_bw / 1e9:.0f} ({100 * torch_bw / copy_bw:.0f}%)",
                f"{torch_ms / met_ms:.2f}x",
            ]
        )

    prefill = met.prefill_inputs(PREFILL)
    met_ms = time_ms(lambda: met.forward(prefill, PREFILL, PREFILL), max(2, iters // 10), 1)
    ids = prefill["ids"][None]
    torch_ms = time_ms(lambda: ref.forward(ids, 0, 1), max(2, iters // 10), 1)
    layer_params = s.layers * sum(t.numel() for t in wts["layers"][0].values())
    attention = 4 * s.layers * s.heads * s.head_dim * PREFILL * PREFILL / 2  # causal QK^T, PV
    flops = 2 * layer_params * PREFILL + 2 * wts["lm_head"].numel() + attention
    out.append(
        [
            s.name,
            f"prefill {PREFILL}",
            f"{met_ms:.2f}",
            f"{torch_ms:.2f}",
            f"{flops / (met_ms / 1e3) / 1e12:.0f} TFLOP/s",
            f"{flops / (torch_ms / 1e3) / 1e12:.0f} TFLOP/s",
            f"{torch_ms / met_ms:.2f}x",
        ]
    )
    return out


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
    for shape in SHAPES:
        table += check_shape(shape, copy_bw, iters)
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
