"""The GPU forward: met's CUDA kernels around torch's matmuls, decode replayed as CUDA graphs.

LlamaModel on a GPU walks torch ops and plans attention with host syncs (masks and slot lists
built per step). CudaLlama runs the same fused weights and KV pool through met._core.cuda
instead: RMSNorm, RoPE on the QKV row, KV append into pages and paged attention read the block
tables on the device, so a step's only host work is packing its rows into a few int arrays and
one upload, and nothing waits on the GPU until the backend reads the sampled tokens back.

A step whose rows are all single tokens (pure decode) of at most the largest captured batch
replays a CUDA graph captured once per batch size (met.kernels.cuda_graphs) over buffers shaped
for the engine's longest context; other steps (prefill chunks, mixed batches) run eagerly.
"""

from __future__ import annotations

import itertools
import logging
import math
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from met.kernels import cuda_ops
from met.kernels.cuda_graphs import DEFAULT_BATCH_SIZES, DecodeGraphs
from met.model.capability import cannot_run
from met.model.kv_cache import PagedKvCache
from met.model.llama import IntArray, LlamaModel

log = logging.getLogger("met.engine")

# What a padding row of a captured batch holds: no KV write (slot -1), no context (attention
# writes zeros), token 0 at position 0. Logits of padding rows are computed and ignored.
_PAD = {"ids": 0, "pos": 0, "slots": -1, "tables": 0, "lens": 0}


def graph_batch_sizes(max_batch: int) -> list[int]:
    """The decode batch sizes to capture: the powers of two below max_batch, then max_batch."""
    return [s for s in DEFAULT_BATCH_SIZES if s < max_batch] + [max_batch]


class CudaLlama:
    """LlamaModel's forward() contract and the backend's forward_rows(), run by met's kernels
    over `model`'s weights and the pool `cache` (both stay owned by them).

    `max_seq_len` bounds every sequence's context (the captured graphs' block tables hold that
    many tokens); `max_batch` is the largest decode batch to capture. `ops` is the kernel set
    (met.kernels.cuda_ops; the CPU tests pass a torch implementation of the same functions), and
    `graphs`: "capture" (CUDA graphs), "eager" (the graphs' padded buffers, run eagerly) or
    "off" (every step eager and unpadded, --enforce-eager).
    """

    def __init__(
        self,
        model: LlamaModel,
        cache: PagedKvCache,
        max_seq_len: int,
        max_batch: int,
        ops: ModuleType = cuda_ops,
        graphs: str = "capture",
    ) -> None:
        if graphs not in ("capture", "eager", "off"):
            raise ValueError(f"graphs: capture, eager or off, not {graphs!r}")
        self.model, self.cache, self.ops = model, cache, ops
        self.config, self.device, self.dtype = model.config, model.device, model.dtype
        c = model.config
        max_positions = model.cos.shape[0]
        self._cos, self._sin = ops.rope_tables(c.inv_freq(), max_positions, self.device)
        self._max_blocks = math.ceil(min(max_seq_len, max_positions) / cache.block_size)
        self._capacity = self._max_blocks * cache.block_size
        self._graphs = None
        if graphs != "off":
            self._graphs = DecodeGraphs(
                self._decode_step,
                self._decode_buffers,
                pad=_PAD,
                batch_sizes=graph_batch_sizes(max_batch),
                capture=graphs == "capture",
            )

    @property
    def graph_batch_sizes(self) -> list[int]:
        return self._graphs.batch_sizes if self._graphs is not None else []

    def allocate_kv_cache(self, num_blocks: int, block_size: int = 16) -> PagedKvCache:
        raise RuntimeError("CudaLlama runs over the KV pool it was built with")

    # --- entry points ---
    def forward_rows(
        self, tokens: list[list[int]], starts: list[int], tables: list[list[int]], spread: int = 0
    ) -> tuple[Tensor, Tensor]:
        """Logits [logits rows, vocab] and each logits row's argmax (int32, on the device:
        reading it is the step's one wait): a row for every token of the first `spread` rows
        (verify rows), one for each other row's last token. A row is its new tokens, the
        position of the first and its block table."""
        packed = _pack(tokens, starts, tables, self.cache.block_size, spread)
        self._validate(packed)
        logits = self._run(packed)
        return logits, self.ops.argmax(logits)

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
        """LlamaModel.forward's arguments and result (float32 logits of `logits_rows`)."""
        if cache is not self.cache:
            raise ValueError("CudaLlama runs over the KV pool it was built with")
        packed = {
            "ids": _host(input_ids, np.int64),
            "pos": _host(positions, np.int64),
            "slots": _host(slot_mapping, np.int64),
            "tables": _host(block_tables, np.int32),
            "lens": _host(seq_lens, np.int32),
            "cu": _host(cu_seqlens, np.int32),
            "rows": _host(logits_rows, np.int64),
        }
        self._validate(packed)
        return self._run(packed)

    __call__ = forward

    def kernel_sample(
        self, logits: Tensor, rows: list[int], params: dict[str, np.ndarray]
    ) -> Tensor:
        """int32 draws of met's sampling kernel for logits rows `rows`; `params` holds one entry
        per row for each of cuda_ops.sample's parameters, in its dtypes."""
        picked = logits.index_select(0, self._on_device(np.asarray(rows, np.int64)))
        args = {name: self._on_device(values) for name, values in params.items()}
        return self.ops.sample(picked, **args)

    # --- one step ---
    def _run(self, packed: dict[str, np.ndarray]) -> Tensor:
        q_lens = np.diff(packed["cu"])
        n_rows = len(q_lens)
        graph_size = self._graphs.size_for(n_rows) if self._graphs is not None else None
        decode = (
            graph_size is not None
            and bool((q_lens == 1).all())
            and np.array_equal(packed["rows"], np.arange(n_rows))
            and packed["tables"].shape[1] <= self._max_blocks
        )
        if decode:
            tables = np.zeros((n_rows, self._max_blocks), np.int32)
            tables[:, : packed["tables"].shape[1]] = packed["tables"]
            names = ("ids", "pos", "slots", "lens")
            inputs = {name: self._upload(packed[name]) for name in names}
            inputs["tables"] = self._upload(tables)
            return self._graphs.run(inputs)
        step = {name: self._on_device(value) for name, value in packed.items()}
        max_query_len = int(q_lens.max())
        max_seq_len = max(int(packed["lens"].max()), max_query_len)
        return self._step(step, max_query_len, max_seq_len, workspace=None)

    def _upload(self, values: np.ndarray) -> Tensor:
        """A host tensor the device can copy from without a sync (pinned on a GPU)."""
        host = torch.from_numpy(np.ascontiguousarray(values))
        return host.pin_memory() if self.device.type == "cuda" else host

    def _on_device(self, values: np.ndarray) -> Tensor:
        """`values` on the model's device, copied behind the current stream's work."""
        return self._upload(values).to(self.device, non_blocking=True)

    def _decode_buffers(self, size: int) -> dict[str, Tensor]:
        dev, i32, i64 = self.device, torch.int32, torch.int64
        buffers = {
            "ids": torch.zeros(size, dtype=i64, device=dev),
            "pos": torch.zeros(size, dtype=i64, device=dev),
            "slots": torch.full((size,), -1, dtype=i64, device=dev),
            "tables": torch.zeros(size, self._max_blocks, dtype=i32, device=dev),
            "lens": torch.zeros(size, dtype=i32, device=dev),
            "cu": torch.arange(size + 1, dtype=i32, device=dev),
        }
        c = self.config
        workspace = self.ops.attention_workspace(
            size, c.n_heads, c.head_dim, c.n_kv_heads, self._capacity, dev
        )
        if workspace is not None:
            buffers["workspace"] = workspace
        return buffers

    def _decode_step(self, buffers: dict[str, Tensor]) -> Tensor:
        return self._step(buffers, 1, self._capacity, buffers.get("workspace"))

    def _step(
        self, b: dict[str, Tensor], max_query_len: int, max_seq_len: int, workspace: Tensor | None
    ) -> Tensor:
        """Float32 logits of rows b["rows"] (every row when absent) after one packed forward."""
        ops, c, m = self.ops, self.config, self.model
        n, d = b["ids"].shape[0], c.head_dim
        q_width, kv_width = c.n_heads * d, c.n_kv_heads * d
        x = F.embedding(b["ids"], m.embed)
        for i, w in enumerate(m.layers):
            k_cache, v_cache = self.cache.k[i], self.cache.v[i]
            qkv = F.linear(ops.rms_norm(x, w["attn_norm"], c.norm_eps), w["wqkv"], w["bqkv"])
            ops.rope_(qkv[:, : q_width + kv_width].view(n, -1, d), b["pos"], self._cos, self._sin)
            k = qkv[:, q_width : q_width + kv_width].view(n, c.n_kv_heads, d)
            v = qkv[:, q_width + kv_width :].view(n, c.n_kv_heads, d)
            ops.kv_append(k_cache, v_cache, k, v, b["slots"])
            attn = ops.paged_attention(
                qkv[:, :q_width].view(n, c.n_heads, d),
                k_cache,
                v_cache,
                b["tables"],
                b["lens"],
                b["cu"],
                max_query_len,
                max_seq_len,
                workspace=workspace,
            )
            x = x + F.linear(attn.view(n, q_width), w["wo"])
            h = F.linear(ops.rms_norm(x, w["mlp_norm"], c.norm_eps), w["w_gate_up"])
            x = x + F.linear(ops.silu_mul(h), w["w_down"])
        if "rows" in b:
            x = x.index_select(0, b["rows"])
        return F.linear(ops.rms_norm(x, m.norm, c.norm_eps), m.lm_head).float()

    def _validate(self, p: dict[str, np.ndarray]) -> None:
        """Rejects rows that would read or write outside the pool, before anything runs."""
        n_tokens, n_rows = len(p["ids"]), len(p["lens"])
        tables = p["tables"]
        if tables.ndim != 2 or tables.shape[0] != n_rows or len(p["cu"]) != n_rows + 1:
            raise ValueError("block_tables [B, max_blocks], seq_lens [B], cu_seqlens [B + 1]")
        if len(p["pos"]) != n_tokens or len(p["slots"]) != n_tokens or p["cu"][-1] != n_tokens:
            raise ValueError("positions, slot_mapping and cu_seqlens must cover every token")
        if n_tokens == 0 or (np.diff(p["cu"]) < 1).any():
            raise ValueError("every row needs at least one new token")
        if ((p["ids"] < 0) | (p["ids"] >= self.config.vocab)).any():
            raise ValueError("token id outside the vocabulary")
        if ((p["rows"] < 0) | (p["rows"] >= n_tokens)).any():
            raise ValueError("logits_rows outside the packed tokens")
        if (p["pos"] >= self._cos.shape[0]).any() or (p["pos"] < 0).any():
            raise ValueError("position outside the RoPE table")
        if (p["lens"] > tables.shape[1] * self.cache.block_size).any():
            raise ValueError("a row's context is longer than its block table covers")
        if (p["lens"] < np.diff(p["cu"])).any():
            raise ValueError("a row has more new tokens than context")
        block_starts = np.arange(tables.shape[1]) * self.cache.block_size
        used = tables[block_starts[None, :] < p["lens"][:, None]]
        if ((used < 0) | (used >= self.cache.num_blocks)).any():
            raise ValueError("block id outside the KV pool")
        if (p["slots"] >= self.cache.num_blocks * self.cache.block_size).any():
            raise ValueError("slot outside the KV pool")


def _pack(
    tokens: list[list[int]],
    starts: list[int],
    tables: list[list[int]],
    block_size: int,
    spread: int = 0,
) -> dict[str, np.ndarray]:
    """The flat arrays of one packed forward from its rows (new tokens, first position, table);
    the first `spread` rows get a logits row per token."""
    q_lens = np.fromiter(map(len, tokens), np.int64, len(tokens))
    cu = np.zeros(len(tokens) + 1, np.int64)
    np.cumsum(q_lens, out=cu[1:])
    n_tokens = int(cu[-1])
    ids = np.fromiter(itertools.chain.from_iterable(tokens), np.int64, n_tokens)
    # Token t of row r sits at position starts[r] + (t - cu[r]).
    offsets = np.asarray(starts, np.int64) - cu[:-1]
    pos = np.repeat(offsets, q_lens) + np.arange(n_tokens)
    width = max(map(len, tables), default=0) or 1
    table = np.zeros((len(tables), width), np.int32)
    for r, row in enumerate(tables):
        table[r, : len(row)] = row
    row_of = np.repeat(np.arange(len(tokens)), q_lens)
    block = table[row_of, np.minimum(pos // block_size, width - 1)].astype(np.int64)
    return {
        "ids": ids,
        "pos": pos,
        "slots": block * block_size + pos % block_size,
        "tables": table,
        "lens": (np.asarray(starts, np.int64) + q_lens).astype(np.int32),
        "cu": cu.astype(np.int32),
        "rows": np.concatenate([np.arange(cu[spread]), cu[spread + 1 :] - 1]),
    }


def _host(values: IntArray, dtype: type) -> np.ndarray:
    if isinstance(values, Tensor):
        values = values.cpu().numpy()
    return np.ascontiguousarray(np.asarray(values), dtype=dtype)


def cuda_forward_for(
    model: LlamaModel, cache: PagedKvCache, max_seq_len: int, max_batch: int, eager: bool = False
) -> LlamaModel | CudaLlama:
    """The forward the engine should run on a GPU: met's kernels whenever the model allows it,
    else the torch forward on the same device (saying why, when it is the model's features)."""
    reason = cannot_run(model, "cuda")
    if reason and model.device.type == "cuda":
        log.warning("%s", reason)
    if reason or cache.k.dtype != model.dtype:
        return model  # the kernels read K/V in the model's dtype
    return CudaLlama(model, cache, max_seq_len, max_batch, graphs="off" if eager else "capture")
