"""The decoder every family in met.model.families runs through, over packed rows and a paged KV
cache: each layer as its LayerSpec says (window, RoPE, Q/K norms, norm placement, dense or MoE MLP).

One forward runs every row of a batch (prefill chunks and decode steps mixed) through each layer
as one set of matmuls over all packed tokens; only attention looks at rows separately, and all
single-token rows share one batched attention call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from met.kernels.cpu_quant import QuantLinear
from met.model.config import ModelConfig
from met.model.deltanet import DeltaNetLayer, plan_rows
from met.model.kv_cache import PagedKvCache
from met.model.layer_extras import (
    head_norms,
    own_values,
    take_layer_extras,
    take_per_layer_inputs,
)
from met.model.linear import Weight, embedding, fuse_rows, linear
from met.model.moe import MoeBlock, clamped_swiglu, take_moe_block
from met.model.paged_attention import IntArray, PagedAttention, _AttnPlan
from met.model.recurrent_state import RecurrentState
from met.model.rope import rope_table, rotate_half


class LlamaModel(PagedAttention):
    """Weights fused for few, large matmuls; call forward once per scheduler step.

    Takes ownership of `weights` (canonical names, see model/config.py): each tensor is popped as
    it is moved and fused, so loading never holds two full copies. Pass a copy to keep the dict.
    Linear weights (and the embedding) may be QuantLinear blocks, which run on the CPU in
    float32 only.
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, Weight],
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        max_positions: int | None = None,
    ) -> None:
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        self.groups = config.n_heads // config.n_kv_heads
        # Tensor parallel: a rank holding a slice of the heads and MLP columns sums its partial
        # attention and MLP outputs with the other ranks' (an all-reduce); None when alone.
        self.reduce: Callable[[Tensor], Tensor] | None = None

        def take(name: str) -> Weight:
            weight = weights.pop(name)
            if not isinstance(weight, QuantLinear):
                return weight.to(device=self.device, dtype=dtype)
            if self.device.type != "cpu" or dtype != torch.float32:
                raise ValueError(
                    f"{name}: quantized (gguf) weights run on the CPU in float32, not "
                    f"{str(dtype).removeprefix('torch.')} on {self.device}"
                )
            return weight

        self.embed = take("embed")
        self.lm_head = take("lm_head") if "lm_head" in weights else self.embed
        self.norm = take("norm")
        self.specs = config.layer_specs()
        # Recurrent layers index their own state pool (model/deltanet.py) in layer order.
        self.recurrent_layers = [i for i, s in enumerate(self.specs) if s.mixer == "recurrent"]
        # Per-layer embeddings (Gemma 4's small models): model-wide tables, None without.
        self.ple = take_per_layer_inputs(config, take) if config.per_layer_dim else None
        self.layers = [self._fuse_layer(weights, i, take) for i in range(config.n_layers)]
        # Layers whose fresh K/V a shared-KV layer reads in the same step.
        self.kv_sources = {s.kv_source for s in self.specs if s.kv_source is not None}
        self._rope_tables(max_positions or config.context_length)

    def _fuse_layer(self, weights: dict[str, Weight], i: int, take) -> dict[str, Weight | None]:
        # One QKV and one gate/up matmul per layer instead of five: per-op overhead dominates
        # small-batch decode on the CPU.
        p, spec, c = f"layers.{i}.", self.specs[i], self.config
        if spec.mixer == "recurrent":
            return self._recurrent_layer(weights, i, take)
        bias = None
        if p + "bq" in weights:
            bias = torch.cat([take(p + "bq"), take(p + "bk"), take(p + "bv")])
        # A shared-KV layer projects only Q; a K-as-V layer (Gemma 4) Q and K.
        own = [] if not spec.own_kv else ["wk"] if spec.k_as_v else ["wk", "wv"]
        q_norm = take(p + "q_norm") if spec.qk_norm != "none" else None
        k_norm = take(p + "k_norm") if spec.qk_norm != "none" and spec.own_kv else None
        dims = (c.n_heads, spec.n_kv_heads or c.n_kv_heads, spec.head_dim or c.head_dim)
        pre, post, gate = spec.pre_norms, spec.post_norms, ["wq_gate"] if spec.attn_gate else []
        return {
            "dims": dims,
            "attn_norm": take(p + "attn_norm") if pre else None,
            # A gated attention layer's (Qwen3.5) gate rows come last, after V.
            "wqkv": self._fuse([take(p + n) for n in ["wq", *own, *gate]]),
            "attn_gate": spec.attn_gate,
            "bqkv": bias,
            "q_norm": q_norm,
            "k_norm": k_norm,
            "qk_norm": head_norms(q_norm, k_norm, dims) if spec.qk_norm == "head" else None,
            "wo": take(p + "wo"),
            "bo": take(p + "bo") if p + "bo" in weights else None,
            "sinks": take(p + "sinks") if spec.sinks else None,
            "mlp_norm": take(p + "mlp_norm") if pre else None,
            "post_attn_norm": take(p + "post_attn_norm") if post else None,
            "post_mlp_norm": take(p + "post_mlp_norm") if post else None,
            **self._mlp(weights, i, take),
        }

    def _recurrent_layer(self, weights: dict[str, Weight], i: int, take) -> dict[str, object]:
        index = self.recurrent_layers.index(i)
        p, c = f"layers.{i}.", self.config
        mixer = DeltaNetLayer(take, p, c.recurrent, c.norm_eps, index, self._fuse)
        return {
            "attn_norm": take(p + "attn_norm"),
            "deltanet": mixer,
            "mlp_norm": take(p + "mlp_norm"),
            "post_attn_norm": None,
            "post_mlp_norm": None,
            **self._mlp(weights, i, take),
        }

    def _mlp(self, weights: dict[str, Weight], i: int, take) -> dict[str, Weight | MoeBlock]:
        p, out = f"layers.{i}.", {}
        if self.specs[i].mlp != "moe":
            out["w_gate_up"] = self._fuse([take(p + "w_gate"), take(p + "w_up")])
            out["w_down"] = take(p + "w_down")
        if self.specs[i].mlp != "dense":
            out["moe"] = take_moe_block(weights, i, self.config, take, self._fuse, self._gated)
        return out | take_layer_extras(weights, i, self.specs[i], take)

    def _fuse(self, parts: list[Weight]) -> Weight:
        return fuse_rows(parts, self.dtype, self.device)

    def _rope_tables(self, max_positions: int) -> None:
        c, dev, dt = self.config, self.device, self.dtype
        self.cos, self.sin = rope_table(c, max_positions, False, dev, dt)
        # Gemma 3's sliding layers rotate with their own base: a second table, None without.
        self.local_cos = self.local_sin = None
        if c.rope_local_theta is not None:
            self.local_cos, self.local_sin = rope_table(c, max_positions, True, dev, dt)
        # Tables of the layers with their own head width (Gemma 4), by (rope, head_dim).
        self.wide_tables = {
            (s.rope, s.head_dim): rope_table(
                c, max_positions, s.rope == "local", dev, dt, s.head_dim
            )
            for s in self.specs
            if s.head_dim not in (None, c.head_dim) and s.rope != "none"
        }

    def allocate_kv_cache(
        self,
        num_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype | None = None,
        state_slots: int = 16,
    ) -> PagedKvCache:
        """A pool in `dtype` (default: the model's; a narrower one, such as float16 under float32
        weights, is rounded to as K/V are stored); a hybrid model's also holds the recurrent
        state of `state_slots` sequences."""
        kv_dtype = dtype or self.dtype
        cache = PagedKvCache.allocate(self.config, num_blocks, block_size, kv_dtype, self.device)
        if self.recurrent_layers:
            n, c = len(self.recurrent_layers), self.config
            cache.state = RecurrentState.allocate(
                c.recurrent, n, state_slots, self.dtype, self.device
            )
        return cache

    @torch.inference_mode()
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
        hidden: bool = False,
    ) -> Tensor:
        """Float32 logits [len(logits_rows), vocab] for the chosen packed positions (hidden:
        their final-normed hidden states [len(logits_rows), hidden] instead, for pooling).

        input_ids, positions, slot_mapping: [T], one entry per packed token, row after row.
        block_tables: [B, max_blocks] (padding: any value). seq_lens: [B], each row's context
        length including this step's tokens; a row's tokens sit at positions seq_len - q .. -1.
        cu_seqlens: [B + 1] packed start of each row. Writes this step's K/V into `cache`.
        state_slots: [B] each row's slot in cache.state (hybrid models only): a row starting at
        position 0 starts from a zeroed state, any other continues its slot's state.
        verify_rows: [B] 1 for rows verifying drafts (hybrid models): their state after each
        token is kept, for cache.state.restore once the scheduler says how many stand.
        state_checkpoints: [C, 3] (row, position, index) (hybrid models): the row's recurrent
        state as of `position` (inside a prefill row) is written into checkpoint `index`.
        """
        dev = self.device
        ids = torch.as_tensor(input_ids, dtype=torch.long).to(dev)
        pos = torch.as_tensor(positions, dtype=torch.long).to(dev)
        slots = torch.as_tensor(slot_mapping, dtype=torch.long).to(dev)
        if int(pos.max()) >= self.cos.shape[0]:
            raise ValueError(f"position {int(pos.max())} is past the RoPE table")
        c = self.config
        # One attention plan per distinct window and query heads per KV head (Gemma: global and
        # sliding layers).
        kinds = {self._plan_kind(i) for i in range(c.n_layers) if "deltanet" not in self.layers[i]}
        plans = {k: self._plan(cache, block_tables, seq_lens, cu_seqlens, *k) for k in kinds}
        tables = {("global", None): (self.cos[pos], self.sin[pos])}
        if self.local_cos is not None:
            tables["local", None] = (self.local_cos[pos], self.local_sin[pos])
        tables |= {key: (cos[pos], sin[pos]) for key, (cos, sin) in self.wide_tables.items()}
        temperature = self._temperature(pos)
        x = embedding(ids, self.embed)
        if c.embed_scale != 1.0:
            x = x * c.embed_scale
        per_layer = None if self.ple is None else self.ple.inputs(ids, x, self._norm)
        recurrent = None
        if self.recurrent_layers:
            recurrent = plan_rows(
                cache.state, seq_lens, cu_seqlens, state_slots, dev, verify_rows, state_checkpoints
            )
        fresh: dict[int, tuple[Tensor, Tensor]] = {}  # this step's K/V of the kv_sources
        for i, (layer, spec) in enumerate(zip(self.layers, self.specs, strict=True)):
            if "deltanet" in layer:
                x = x + layer["deltanet"](self._pre_norm(x, layer["attn_norm"]), *recurrent)
                x = x + self._mlp_out(x, layer)
                continue
            kv = cache.layer_slots(i)
            key = (spec.rope, None if spec.head_dim == c.head_dim else spec.head_dim)
            rope = None if spec.rope == "none" else tables[key]
            shared = None if spec.own_kv else fresh[spec.kv_source]
            plan = plans[self._plan_kind(i)]
            x, new_kv = self._layer(x, layer, kv, slots, rope, temperature, plan, shared)
            if i in self.kv_sources:
                fresh[i] = new_kv
            if per_layer is not None and spec.per_layer_input:
                x = self.ple.add(x, per_layer[:, i], layer, self._norm)
            if "out_scale" in layer:
                x = x * layer["out_scale"]
        rows = torch.as_tensor(logits_rows, dtype=torch.long).to(dev)
        normed = self._norm(x[rows], self.norm)
        return normed.float() if hidden else self.head(normed)

    __call__ = forward

    def head(self, hidden: Tensor) -> Tensor:
        """Float32 logits of final-normed hidden states (forward's `hidden` output)."""
        logits = linear(hidden.to(self.dtype), self.lm_head).float()
        if self.config.final_softcap:
            cap = self.config.final_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _plan_kind(self, layer: int) -> tuple[int | None, int]:
        n_heads, n_kv, _ = self.layers[layer]["dims"]
        return self.specs[layer].window, n_heads // n_kv

    def _temperature(self, pos: Tensor) -> Tensor | None:
        """Each token's query scale [T, 1, 1] under query temperature (Ministral 3), else None."""
        c = self.config
        if not c.attn_temp_scale:
            return None
        steps = torch.floor(pos.double() / c.attn_temp_length)
        scale = 1.0 + c.attn_temp_scale * torch.log1p(steps)
        return scale.to(self.dtype)[:, None, None]

    def _layer(
        self,
        x: Tensor,
        w: dict[str, Weight | None],
        kv: tuple[Tensor, Tensor],
        slots: Tensor,
        rope: tuple[Tensor, Tensor] | None,
        temperature: Tensor | None,
        plan: _AttnPlan,
        shared: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """The layer's output and this step's K/V; shared: a shared-KV layer's source's, which
        it attends over (in the pool already) instead of its own."""
        n_heads, n_kv, head_dim = w["dims"]
        n_tok, q_width = x.shape[0], n_heads * head_dim
        kv_width = 0 if shared is not None else n_kv * head_dim
        qkv = linear(self._pre_norm(x, w["attn_norm"]), w["wqkv"], w["bqkv"])
        if w["q_norm"] is not None and w["qk_norm"] is None:
            qkv = self._projection_norms(qkv, w["q_norm"], w["k_norm"])
        # Q and K rotate together as one [T, n_heads + n_kv_heads, head_dim] tensor.
        qk = qkv[:, : q_width + kv_width].view(n_tok, -1, head_dim)
        if w["qk_norm"] is not None:
            qk = F.rms_norm(qk, (head_dim,), eps=self.config.norm_eps) * w["qk_norm"]
        if rope is not None:
            qk = rotate_half(qk, *rope)
        q, k = qk[:, :n_heads], qk[:, n_heads:]
        if temperature is not None:
            q = q * temperature
        k_cache, v_cache = kv
        if shared is not None:
            k, v = shared
        else:
            v = own_values(qkv, w, q_width, kv_width, self.config.norm_eps)
            if k_cache.dtype != k.dtype:
                # A narrower pool (fp16 KV): attention sees the stored values, fresh rows too.
                k, v = k.to(k_cache.dtype).to(k.dtype), v.to(v_cache.dtype).to(v.dtype)
            k_cache.index_copy_(0, slots, k.to(k_cache.dtype))
            v_cache.index_copy_(0, slots, v.to(v_cache.dtype))
        out = self._attention(q, k, v, k_cache, v_cache, plan, w["sinks"])
        if w["attn_gate"]:  # the gate's rows follow V's
            out = out * torch.sigmoid(qkv[:, q_width + 2 * kv_width :])
        attn = self._reduced(linear(out, w["wo"]))
        if w["bo"] is not None:  # after the reduce: a bias is added once, not once per rank
            attn = attn + w["bo"]
        x = x + (attn if w["post_attn_norm"] is None else self._norm(attn, w["post_attn_norm"]))
        return x + self._mlp_out(x, w), (k, v)

    def _mlp_out(self, x: Tensor, w: dict[str, Weight | None]) -> Tensor:
        """What the MLP sublayer adds to the residual x: dense, MoE, or both (Gemma 4: each
        output normalized, the sum normalized again), through the post-norm where there is one."""
        h = self._pre_norm(x, w["mlp_norm"])
        if "w_gate_up" not in w:
            return self._reduced(w["moe"](h))
        gate, up = linear(h, w["w_gate_up"]).chunk(2, dim=-1)
        mlp = self._reduced(linear(self._gated(gate, up), w["w_down"]))
        if "moe" in w:
            experts = self._reduced(w["moe"](self._norm(x, w["moe_norm"]), router_input=x))
            mlp = self._norm(mlp, w["post_mlp_norm_1"]) + self._norm(experts, w["post_moe_norm"])
        return mlp if w["post_mlp_norm"] is None else self._norm(mlp, w["post_mlp_norm"])

    # The two elementwise stages with a reduction or a transcendental, as methods so that a test
    # reference can run them (and _attention) through the C++ kernels: see test_cpu_model.py.
    def _norm(self, x: Tensor, weight: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.config.norm_eps)

    def _pre_norm(self, x: Tensor, weight: Tensor | None) -> Tensor:
        # A layer without pre-norms (OLMo 2) feeds its sublayers the residual stream as is.
        return x if weight is None else self._norm(x, weight)

    def _projection_norms(self, qkv: Tensor, q_norm: Tensor, k_norm: Tensor) -> Tensor:
        """Q and K each RMS-normalized over its whole projection (OLMo 2), V as it is."""
        q_width = q_norm.shape[0]
        kv_width = k_norm.shape[0]
        q = self._norm(qkv[:, :q_width], q_norm)
        k = self._norm(qkv[:, q_width : q_width + kv_width], k_norm)
        return torch.cat([q, k, qkv[:, q_width + kv_width :]], dim=-1)

    def _gated(self, gate: Tensor, up: Tensor) -> Tensor:
        c = self.config
        if c.activation == "gelu_tanh":
            return F.gelu(gate, approximate="tanh") * up
        if c.activation == "swiglu_clamped":
            return clamped_swiglu(gate, up, c.swiglu_limit, c.swiglu_alpha)
        return F.silu(gate) * up

    def _reduced(self, partial: Tensor) -> Tensor:
        return partial if self.reduce is None else self.reduce(partial)
