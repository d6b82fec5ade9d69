"""The CPU forward of a GGUF-quantized model: the whole layer loop in C++ (met._core.cpu).

LlamaModel walks each layer op by op through torch, which at batch 1 costs more in per-op
overhead than the matmuls themselves. When every linear weight is kept as GGUF blocks, the model
runs instead through _core.cpu.LlamaForward: one call per scheduler step, one OpenMP team,
quantized matmuls, paged attention and fused elementwise kernels, each computing a token's row
independently of the rest of the batch (so greedy output is batch-invariant).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from met import _core
from met.kernels.cpu_quant import QuantLinear
from met.model.capability import cannot_run
from met.model.kv_cache import PagedKvCache
from met.model.llama import IntArray, LlamaModel
from met.model.moe import MoeBlock

if TYPE_CHECKING:
    from met.model.families.spec import LayerSpec

_MLP_NAMES = ("w_gate_up", "w_down")


def _weight(w: QuantLinear) -> tuple[int, str, int, int]:
    return (w.blocks.data_ptr(), w.qtype, w.out_features, w.in_features)


# KV pool dtypes the C++ forward stores and reads.
KV_DTYPES = (torch.float16, torch.float32)


def _pool_address(t: Tensor) -> int:
    if t.dtype not in KV_DTYPES or not t.is_contiguous():
        raise ValueError("the C++ forward takes a contiguous float16 or float32 KV pool")
    return t.data_ptr()


def _address(t: Tensor | None) -> int:
    if t is None:
        return 0
    if t.dtype != torch.float32 or not t.is_contiguous():
        raise ValueError("the C++ forward takes contiguous float32 norms, biases and tables")
    return t.data_ptr()


class CpuLlama:
    """LlamaModel's forward() contract, run by _core.cpu.LlamaForward over the same weights and
    KV pool (both stay owned by `model` and `cache`, which this object keeps alive)."""

    def __init__(self, model: LlamaModel, cache: PagedKvCache, n_threads: int = 0) -> None:
        reason = cannot_run(model, "cpu")
        if reason:
            raise ValueError(f"CpuLlama: {reason}")
        self.model, self.cache = model, cache
        self.config, self.device, self.dtype = model.config, model.device, model.dtype
        c = model.config
        embed = model.embed
        embed_spec = (
            _weight(embed)
            if isinstance(embed, QuantLinear)
            else (_address(embed), "F32", c.vocab, c.hidden)
        )
        self._cos, self._sin = _dense_table(model.cos), _dense_table(model.sin)
        local = None  # Gemma 3's sliding layers' own tables
        if model.local_cos is not None:
            local = (_dense_table(model.local_cos), _dense_table(model.local_sin))
        self._local = local
        dims = {
            "dim": c.hidden,
            "n_layers": c.n_layers,
            "n_heads": c.n_heads,
            "n_kv_heads": c.n_kv_heads,
            "head_dim": c.head_dim,
            "ffn": c.ffn,
            "vocab": c.vocab,
            "norm_eps": c.norm_eps,
            "max_positions": self._cos.shape[0],
            "num_blocks": cache.num_blocks,
            "block_size": cache.block_size,
            "kv_half": cache.k.dtype == torch.float16,
            "attn_scale": c.query_scale or 0.0,
            "attn_softcap": c.attn_softcap or 0.0,
            "final_softcap": c.final_softcap or 0.0,
            "embed_scale": c.embed_scale,
            "gelu": c.activation == "gelu_tanh",
        }
        if c.attn_temp_scale:
            dims |= {"attn_temp_scale": c.attn_temp_scale, "attn_temp_length": c.attn_temp_length}
        if c.n_experts:
            dims |= {
                "n_experts": c.n_experts,
                "n_experts_used": c.n_experts_used,
                "moe_norm_topk": c.moe_norm_topk,
            }
        self._keep: list[Tensor] = []  # tables and weights made here, alive as long as _impl
        layers = [
            {
                "attn_norm": _address(layer["attn_norm"]),
                "wqkv": _weight(layer["wqkv"]),
                "bqkv": _address(layer["bqkv"]),
                "q_norm": _address(layer["q_norm"]),
                "k_norm": _address(layer["k_norm"]),
                "wo": _weight(layer["wo"]),
                "mlp_norm": _address(layer["mlp_norm"]),
                **_mlp_spec(layer),
                "window": spec.window or 0,
                "qk_norm_full": spec.qk_norm == "full",
                "no_rope": spec.rope == "none",
                **_post_norms_and_rope(layer, local if spec.rope == "local" else None),
                **self._own_shape(i, layer, spec),  # last: a layer's own RoPE width wins
            }
            for i, (layer, spec) in enumerate(zip(model.layers, model.specs, strict=True))
        ]
        self._impl = _core.cpu.LlamaForward(
            dims,
            embed_spec,
            _weight(model.lm_head),
            _address(model.norm),
            layers,
            self._cos.data_ptr(),
            self._sin.data_ptr(),
            _pool_address(cache.k),
            _pool_address(cache.v),
            n_threads or torch.get_num_threads(),
        )

    def _own_shape(self, i: int, layer: dict, spec: LayerSpec) -> dict:
        """Gemma 4's per-layer parts: widths, pages, RoPE tables, V and the output scale."""
        model, cache, c = self.model, self.cache, self.config
        _, n_kv, head_dim = layer["dims"]
        out: dict = {"head_dim": head_dim, "n_kv_heads": n_kv, "shared_kv": not spec.own_kv}
        if cache.where is not None:  # a pool of several widths: this layer's own pages
            k, v = cache.layer_slots(i)
            out |= {"k_pages": k.data_ptr(), "v_pages": v.data_ptr()}
        if layer["k_as_v"]:
            out["k_as_v"] = True
        if layer["v_norm"]:
            self._keep.append(torch.ones(head_dim))  # RMSNorm without a weight
            out["v_norm"] = self._keep[-1].data_ptr()
        if "out_scale" in layer:
            out["out_scale"] = _address(layer["out_scale"])
        if head_dim != c.head_dim and spec.rope != "none":
            tables = [_dense_table(t) for t in model.wide_tables[spec.rope, head_dim]]
            self._keep += tables
            out["rope_cos"], out["rope_sin"] = (t.data_ptr() for t in tables)
        return out

    @property
    def n_threads(self) -> int:
        return self._impl.n_threads

    @property
    def kernel_seconds(self) -> float:
        """Wall time spent inside the C++ forward so far (benchmarks/host_overhead.py)."""
        return self._impl.kernel_seconds

    def allocate_kv_cache(self, num_blocks: int, block_size: int = 16) -> PagedKvCache:
        raise RuntimeError("CpuLlama runs over the KV pool it was built with")

    def forward(
        self,
        cache: PagedKvCache,
        input_ids: IntArray,
        positions: IntArray,
        slot_mapping: IntArray,
        block_tables: IntArray,
        seq_lens: IntArray,
        cu_seqlens: IntArray,
        logits_rows: IntArray,
    ) -> Tensor:
        """LlamaModel.forward's arguments and result; positions and slots follow from the block
        tables, seq_lens and cu_seqlens, so the first two are not read again."""
        if cache is not self.cache:
            raise ValueError("CpuLlama runs over the KV pool it was built with")
        ids = _dense(input_ids, torch.int64)
        tables = _dense(block_tables, torch.int32)
        lens = _dense(seq_lens, torch.int32)
        cu = _dense(cu_seqlens, torch.int32)
        rows = _dense(logits_rows, torch.int64)
        if tables.dim() != 2 or tables.shape[0] != lens.numel() or cu.numel() != lens.numel() + 1:
            raise ValueError("block_tables [B, max_blocks], seq_lens [B], cu_seqlens [B + 1]")
        if int(cu[-1]) != ids.numel():
            raise ValueError("cu_seqlens must end at the number of packed tokens")
        logits = torch.empty(rows.numel(), self.config.vocab, dtype=torch.float32)
        self._impl.forward(
            ids.data_ptr(),
            lens.numel(),
            cu.data_ptr(),
            lens.data_ptr(),
            tables.data_ptr(),
            tables.shape[1],
            rows.data_ptr(),
            rows.numel(),
            logits.data_ptr(),
        )
        return logits

    __call__ = forward

    def forward_rows(
        self, tokens: list[list[int]], starts: list[int], tables: list[list[int]]
    ) -> tuple[Tensor, list[int]]:
        """Logits [rows, vocab] of each row's last token and each row's argmax (torch.argmax's
        pick); a row is its new tokens, the position of the first and its block table. The
        backend's path: packing and the greedy pick happen in C++, so a step creates one torch
        tensor."""
        logits = torch.empty(len(tokens), self.config.vocab, dtype=torch.float32)
        greedy = self._impl.forward_rows(tokens, starts, tables, logits.data_ptr())
        return logits, greedy


def _mlp_spec(layer: dict) -> dict:
    """A layer's MLP as the C++ forward takes it: dense gate/up and down, or the MoE router
    (float32) and every expert's pair of weights in expert order."""
    moe: MoeBlock | None = layer.get("moe")
    if moe is None:
        return {name: _weight(layer[name]) for name in _MLP_NAMES}
    experts = [moe.experts[e] for e in range(moe.n_experts)]
    return {
        "router": _address(moe.router),
        "experts": [(_weight(gate_up), _weight(down)) for gate_up, down in experts],
    }


def _dense_table(table: Tensor) -> Tensor:
    # The RoPE tables are [positions, 1, head_dim / 2] views; the C++ side reads them dense.
    return table.reshape(table.shape[0], -1).contiguous()


def _post_norms_and_rope(layer: dict, rope: tuple[Tensor, Tensor] | None) -> dict[str, int]:
    """A layer's optional parts: post-sublayer norms and its own RoPE tables."""
    out = {}
    for name in ("post_attn_norm", "post_mlp_norm"):
        if layer[name] is not None:
            out[name] = _address(layer[name])
    if rope is not None:
        out["rope_cos"], out["rope_sin"] = _address(rope[0]), _address(rope[1])
    return out


def _dense(values: IntArray, dtype: torch.dtype) -> Tensor:
    return torch.as_tensor(values).to(device="cpu", dtype=dtype).contiguous()


def cpu_forward_for(model: LlamaModel, cache: PagedKvCache) -> LlamaModel | CpuLlama:
    """The forward the engine should run: the C++ one whenever the model and pool allow it."""
    if cannot_run(model, "cpu") or cache.k.dtype not in KV_DTYPES:
        return model
    return CpuLlama(model, cache)
