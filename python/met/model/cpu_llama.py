"""The CPU forward of a GGUF-quantized model: the whole layer loop in C++ (met._core.cpu).

LlamaModel walks each layer op by op through torch, which at batch 1 costs more in per-op
overhead than the matmuls themselves. When every linear weight is kept as GGUF blocks, the model
runs instead through _core.cpu.LlamaForward: one call per scheduler step, one OpenMP team,
quantized matmuls, paged attention and fused elementwise kernels, each computing a token's row
independently of the rest of the batch (so greedy output is batch-invariant).
"""

from __future__ import annotations

import torch
from torch import Tensor

from met import _core
from met.kernels.cpu_quant import QuantLinear
from met.model.capability import cannot_run
from met.model.cpu_mlp import address, mlp_widths, set_mlp, weight, whole
from met.model.deltanet import DeltaNetLayer
from met.model.families.spec import LayerSpec
from met.model.kv_cache import PagedKvCache
from met.model.layer_extras import PerLayerInputs
from met.model.linear import RowParts
from met.model.llama import IntArray, LlamaModel
from met.model.moe import MoeBlock
from met.model.recurrent_state import RecurrentState

# A layer's float32 tensors the C++ forward reads by address (None: the layer has none).
_NORMS_AND_BIASES = (
    "attn_norm",
    "bqkv",
    "q_norm",
    "k_norm",
    "mlp_norm",
    "post_attn_norm",
    "post_mlp_norm",
    "bo",
    "sinks",
)
# KV pool dtypes the C++ forward stores and reads.
KV_DTYPES = (torch.float16, torch.float32)


def _pool_address(t: Tensor) -> int:
    if t.dtype not in KV_DTYPES or not t.is_contiguous():
        raise ValueError("the C++ forward takes a contiguous float16 or float32 KV pool")
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
        self.recurrent_layers = model.recurrent_layers
        self._cos, self._sin = _dense_table(model.cos), _dense_table(model.sin)
        local = None  # Gemma 3's sliding layers' own tables
        if model.local_cos is not None:
            local = (_dense_table(model.local_cos), _dense_table(model.local_sin))
        self._local = local
        weights = _core.cpu.LlamaWeights()
        _table(weights, "embed", model.embed)
        weights.lm_head = weight(model.lm_head)
        weights.norm = address(model.norm)
        if model.ple is not None:  # Gemma 4's per-layer embeddings
            _per_layer_inputs(model.ple, weights)
        weights.rope_cos, weights.rope_sin = self._cos.data_ptr(), self._sin.data_ptr()
        self._keep: list[Tensor] = []  # tables and weights made here, alive as long as _impl
        layers = []
        for i, (layer, spec) in enumerate(zip(model.layers, model.specs, strict=True)):
            if "deltanet" in layer:
                layers.append(self._recurrent(layer, spec))
                continue
            out = _layer(layer, spec, local if spec.rope == "local" else None)
            self._shared_expert(layer, out)
            self._own_shape(i, layer, spec, out)  # last: a layer's own RoPE width wins
            layers.append(out)
        weights.layers = layers
        self._impl = _core.cpu.LlamaForward(
            _dims(model, cache, self._cos.shape[0]),
            weights,
            _pool_address(cache.k),
            _pool_address(cache.v),
            n_threads or torch.get_num_threads(),
        )
        self._pools = (0, 0)  # the snapshots' and checkpoints' addresses the forward was given
        if cache.state is not None:
            self._point_at_state()

    def _recurrent(self, layer: dict, spec: LayerSpec) -> _core.cpu.LayerWeights:
        """A Gated DeltaNet layer (model/deltanet.py's DeltaNetLayer) and its MLP."""
        mixer: DeltaNetLayer = layer["deltanet"]
        out = set_mlp(layer, _core.cpu.LayerWeights())
        out.mixer = _core.cpu.Mixer.recurrent
        out.attn_norm, out.mlp_norm = address(layer["attn_norm"]), address(layer["mlp_norm"])
        out.ssm_qkv, out.ssm_z, out.ssm_beta, out.ssm_alpha = _projections(mixer)
        out.ssm_out = weight(mixer.w_out)
        tensors = [mixer.conv, mixer.dt_bias, mixer.decay, mixer.norm]
        self._keep += [t.float().contiguous() for t in tensors]
        out.ssm_conv, out.ssm_dt, out.ssm_a, out.ssm_norm = (t.data_ptr() for t in self._keep[-4:])
        out.state_index = mixer.index
        self._shared_expert(layer, out)
        return out

    def _shared_expert(self, layer: dict, out: _core.cpu.LayerWeights) -> None:
        """A MoE layer's sigmoid-gated shared expert (Qwen3.5-MoE, Qwen3-Next), if it has one."""
        moe: MoeBlock | None = layer.get("moe")
        if moe is None or moe.shared is None:
            return
        gate, (gate_up, down) = moe.shared
        dense_gate = gate.dequantize() if isinstance(gate, QuantLinear) else gate
        self._keep.append(dense_gate.float().reshape(-1).contiguous())
        out.shexp_gate = self._keep[-1].data_ptr()
        out.shexp_gate_up, out.shexp_down = weight(gate_up), weight(down)

    def _point_at_state(self) -> None:
        """Tells the C++ forward where the recurrent state and its snapshots live (again after
        RecurrentState.keep_snapshots reallocates them)."""
        state, pools = self.cache.state, _core.cpu.RecurrentState()
        for name in ("conv", "delta"):
            setattr(pools, name, address(getattr(state, name)))
        pools.n_slots = state.n_slots
        if state.snap_conv is not None:
            pools.snap_conv = address(state.snap_conv)
            pools.snap_delta = address(state.snap_delta)
            pools.snap_depth = state.snap_conv.shape[2]
        if state.ckpt_conv is not None:
            pools.ckpt_conv = address(state.ckpt_conv)
            pools.ckpt_delta = address(state.ckpt_delta)
            pools.n_checkpoints = state.ckpt_conv.shape[0]
        self._pools = _pool_addresses(state)
        self._impl.set_recurrent_state(pools)

    def _own_shape(self, i: int, layer: dict, spec: LayerSpec, out: _core.cpu.LayerWeights) -> None:
        """Gemma 4's per-layer parts: widths, pages, RoPE tables, V and the output scale."""
        model, cache, c = self.model, self.cache, self.config
        _, n_kv, head_dim = layer["dims"]
        out.head_dim, out.n_kv_heads, out.shared_kv = head_dim, n_kv, not spec.own_kv
        if cache.where is not None:  # a pool of several widths: this layer's own pages
            k, v = cache.layer_slots(i)
            out.k_pages, out.v_pages = k.data_ptr(), v.data_ptr()
        out.k_as_v = bool(layer["k_as_v"])
        if layer["v_norm"]:
            self._keep.append(torch.ones(head_dim))  # RMSNorm without a weight
            out.v_norm = self._keep[-1].data_ptr()
        if "out_scale" in layer:
            out.out_scale = address(layer["out_scale"])
        if head_dim != c.head_dim and spec.rope != "none":
            tables = [_dense_table(t) for t in model.wide_tables[spec.rope, head_dim]]
            self._keep += tables
            out.rope_cos, out.rope_sin = (t.data_ptr() for t in tables)

    @property
    def n_threads(self) -> int:
        return self._impl.n_threads

    @property
    def direct_forward(self) -> _core.cpu.LlamaForward:
        """The forward the scheduler may run its decode and verify steps on itself (see
        TorchBackend.for_scheduler). With recurrent layers it runs them on the state pools this
        class last pointed it at; a verify row longer than the snapshots kept goes through
        forward_rows, which makes room."""
        return self._impl

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
        state_slots: IntArray | None = None,
        verify_rows: IntArray | None = None,
        state_checkpoints: IntArray | None = None,
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
        slots, verify = self._state_rows(state_slots, verify_rows, cu)
        marks = _dense([] if state_checkpoints is None else state_checkpoints, torch.int64)
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
            0 if slots is None else slots.data_ptr(),
            0 if verify is None else verify.data_ptr(),
            marks.data_ptr(),
            marks.numel() // 3,
        )
        return logits

    __call__ = forward

    def _state_rows(
        self, state_slots: IntArray | None, verify_rows: IntArray | None, cu: Tensor
    ) -> tuple[Tensor | None, Tensor | None]:
        """The rows' state slots and verify flags as the C++ forward reads them; room for a
        snapshot of each verify row's every token first (model/deltanet.py plan_rows)."""
        if self.cache.state is None:
            return None, None
        if state_slots is None:
            raise ValueError("a model with recurrent layers needs state_slots")
        slots = _dense(state_slots, torch.int32)
        verify = None if verify_rows is None else _dense(verify_rows, torch.uint8)
        lengths = (cu[1:] - cu[:-1])[verify.bool()] if verify is not None else cu[:0]
        self._ready_state(lengths.tolist())
        return slots, verify

    def _ready_state(self, verify_lengths: list[int]) -> None:
        """Room for a snapshot of every token of the longest verify row, and the C++ forward
        pointed at the state pools (keep_snapshots may reallocate them)."""
        if verify_lengths:
            self.cache.state.keep_snapshots(max(verify_lengths))
        if self._pools != _pool_addresses(self.cache.state):
            self._point_at_state()

    def forward_rows(
        self,
        tokens: list[list[int]],
        starts: list[int],
        tables: list[list[int]],
        spread: int = 0,
        state_slots: list[int] | None = None,
        state_checkpoints: list[int] | None = None,
        verify: list[bool] | None = None,
    ) -> tuple[Tensor, list[int]]:
        """Logits [logits rows, vocab] and each logits row's argmax (torch.argmax's pick): a row
        for every token of the first `spread` rows (verify rows), one for each other row's last
        token. A row is its new tokens, the position of the first and its block table (and, with
        recurrent layers, its state slot and whether it verifies drafts; state_checkpoints: flat
        (row, position, index) triples, as forward's). The backend's path: packing and the
        greedy pick happen in C++, so a step creates one torch tensor."""
        n_logits = sum(map(len, tokens[:spread])) + len(tokens) - spread
        logits = torch.empty(n_logits, self.config.vocab, dtype=torch.float32)
        flags = [] if verify is None else [int(v) for v in verify]
        if self.cache.state is not None:
            # No flags: no row verifies (zip then stops at once).
            self._ready_state([len(t) for t, v in zip(tokens, flags, strict=False) if v])
        slots, marks = state_slots or [], state_checkpoints or []
        greedy = self._impl.forward_rows(
            tokens, starts, tables, logits.data_ptr(), spread, slots, flags, marks
        )
        return logits, greedy


def _dims(model: LlamaModel, cache: PagedKvCache, max_positions: int) -> _core.cpu.LlamaDims:
    """The model's shape and model-wide settings, as the C++ forward takes them."""
    c = model.config
    d = _core.cpu.LlamaDims()
    d.dim, d.n_layers, d.n_heads, d.n_kv_heads = c.hidden, c.n_layers, c.n_heads, c.n_kv_heads
    d.head_dim, d.vocab, d.norm_eps = c.head_dim, c.vocab, c.norm_eps
    d.ffn, d.expert_ffn = mlp_widths(model)
    d.max_positions, d.num_blocks, d.block_size = max_positions, cache.num_blocks, cache.block_size
    d.kv_half = cache.k.dtype == torch.float16
    d.attn_scale, d.attn_softcap = c.query_scale or 0.0, c.attn_softcap or 0.0
    d.final_softcap, d.embed_scale = c.final_softcap or 0.0, c.embed_scale
    d.gelu = c.activation == "gelu_tanh"
    d.attn_temp_scale, d.attn_temp_length = c.attn_temp_scale, c.attn_temp_length
    d.n_experts, d.n_experts_used, d.moe_norm_topk = c.n_experts, c.n_experts_used, c.moe_norm_topk
    d.moe_topk_softmax = any(s.router == "topk_softmax" for s in model.specs)
    if c.activation == "swiglu_clamped":
        d.swiglu_limit, d.swiglu_alpha = c.swiglu_limit, c.swiglu_alpha
    d.rope_dims, d.shared_ffn = c.rope_dims or 0, c.shared_ffn or 0
    d.per_layer_dim = c.per_layer_dim or 0
    if c.recurrent is not None:
        r, shape = d.recurrent, c.recurrent
        r.k_heads, r.v_heads, r.kernel = shape.k_heads, shape.v_heads, shape.kernel
        r.k_dim, r.v_dim, r.tiled = shape.k_dim, shape.v_dim, shape.tiled
        d.recurrent = r  # pybind11 hands out a copy of the member
    return d


def _layer(
    layer: dict, spec: LayerSpec, rope: tuple[Tensor, Tensor] | None
) -> _core.cpu.LayerWeights:
    """One layer as its LayerSpec plans it: its kind, then its weights."""
    out = _core.cpu.LayerWeights()
    out.mixer = _core.cpu.Mixer.attention
    out.wqkv, out.wqkv_parts = whole(layer["wqkv"])
    out.wo = weight(layer["wo"])
    for name in _NORMS_AND_BIASES:
        setattr(out, name, address(layer[name]))
    out.window = spec.window or 0
    out.qk_norm_full = spec.qk_norm == "full"
    out.no_rope = spec.rope == "none"
    out.attn_gate = spec.attn_gate
    if spec.per_layer_input:
        out.per_layer_input = True
        out.ple_gate, out.ple_proj = weight(layer["ple_gate"]), weight(layer["ple_proj"])
        out.ple_norm = address(layer["ple_norm"])
    if rope is not None:
        out.rope_cos, out.rope_sin = address(rope[0]), address(rope[1])
    return set_mlp(layer, out)


def _table(weights: _core.cpu.LlamaWeights, name: str, table: Tensor | QuantLinear) -> None:
    """An embedding table as blocks (`name`) or float32 (`name`_dense)."""
    if isinstance(table, QuantLinear):
        setattr(weights, name, weight(table))
    else:
        setattr(weights, name + "_dense", address(table))


def _per_layer_inputs(ple: PerLayerInputs, weights: _core.cpu.LlamaWeights) -> None:
    """The model-wide per-layer-embedding tables (model/layer_extras.py)."""
    _table(weights, "ple_embed", ple.embed)
    weights.ple_model_proj = weight(ple.model_proj)
    weights.ple_proj_norm = address(ple.norm)


def _projections(mixer: DeltaNetLayer) -> list[_core.cpu.QuantWeight]:
    """A DeltaNet layer's four projections: its row parts as stored, or row ranges of the one
    fused weight."""
    if isinstance(mixer.w_in, RowParts):
        return [weight(w) for w in mixer.w_in.parts]
    fused, s = mixer.w_in, mixer.shape
    bounds = [0, s.conv_dim, s.conv_dim + s.value_width, s.conv_dim + s.value_width + s.v_heads]
    bounds.append(fused.out_features)
    row_bytes, base = fused.blocks.shape[1], fused.blocks.data_ptr()
    return [
        _core.cpu.QuantWeight(base + a * row_bytes, fused.qtype, b - a, fused.in_features)
        for a, b in zip(bounds, bounds[1:], strict=False)
    ]


def _pool_addresses(state: RecurrentState) -> tuple[int, int]:
    """Where the snapshots and checkpoints are now (0: not allocated)."""
    pools = (state.snap_conv, state.ckpt_conv)
    return tuple(0 if t is None else t.data_ptr() for t in pools)


def _dense_table(table: Tensor) -> Tensor:
    # The RoPE tables are [positions, 1, head_dim / 2] views; the C++ side reads them dense.
    return table.reshape(table.shape[0], -1).contiguous()


def _dense(values: IntArray, dtype: torch.dtype) -> Tensor:
    return torch.as_tensor(values).to(device="cpu", dtype=dtype).contiguous()


def cpu_forward_for(model: LlamaModel, cache: PagedKvCache) -> LlamaModel | CpuLlama:
    """The forward the engine should run: the C++ one whenever the model and pool allow it."""
    if cannot_run(model, "cpu") or cache.k.dtype not in KV_DTYPES:
        return model
    return CpuLlama(model, cache)
