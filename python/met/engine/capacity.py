"""The engine's capacity plan: the KV pool's size (plan_capacity), and the plan in words: what
the weights take, how big the pool is, how many sequences of what length it holds, and which flag
changes what. Said once at start-up (the server's ready line) and by `met doctor --model M`, so
that "why only 8 at once?" has its answer before it is asked."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor

from met.config import EngineConfig
from met.engine.kv_budget import (
    PoolShape,
    activation_reserve,
    gpu_budget,
    pool_blocks,
    pool_shape,
)
from met.kernels.cpu_quant import QuantLinear
from met.model.config import ModelConfig
from met.model.deltanet import DeltaNetLayer
from met.model.linear import RowParts
from met.model.moe import MoeBlock
from met.model.recurrent_state import state_bytes

# A typical request's prompt + output, for the second figure of the plan.
_EXAMPLE_TOKENS = 1024


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def weight_bytes(model) -> int:
    """Bytes the model's weights hold in memory (a tied embedding counted once)."""
    seen: dict[int, int] = {}
    weights = [model.embed, model.lm_head, model.norm]
    ple = getattr(model, "ple", None)  # per-layer embeddings (Gemma 4): one more table
    if ple is not None:
        weights += [ple.embed, ple.model_proj, ple.norm]
    for layer in model.layers:
        for value in layer.values():
            if isinstance(value, MoeBlock):  # the router and the experts this rank holds
                weights.append(value.router)
                weights.extend(part for expert in value.experts.values() for part in expert)
                if value.shared is not None:
                    weights += [value.shared[0], *value.shared[1]]
            elif isinstance(value, DeltaNetLayer):
                weights.extend(vars(value).values())
            else:
                weights.append(value)
    weights = [p for w in weights for p in (w.parts if isinstance(w, RowParts) else [w])]
    for weight in weights:
        if isinstance(weight, QuantLinear):
            seen[id(weight)] = weight.blocks.numel()
        elif isinstance(weight, Tensor):
            seen[id(weight)] = weight.numel() * weight.element_size()
    return sum(seen.values())


@dataclass(frozen=True)
class CapacityPlan:
    device: str
    weights_bytes: int
    kv_dtype: str
    kv_token_bytes: int
    kv_blocks: int
    block_size: int
    max_num_seqs: int
    max_model_len: int
    sized_by: str  # how the pool's size was chosen, in words naming its flag
    state_bytes: int = 0  # a hybrid model's recurrent state, one sequence's (0: none)

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.block_size

    def sequences_of(self, tokens: int) -> int:
        """Sequences of `tokens` (prompt + max_tokens) the pool holds at once: the scheduler
        admits a request only while every admitted one's whole budget still fits."""
        return self.kv_blocks // (tokens // self.block_size + 1)

    def describe(self) -> str:
        full = self.sequences_of(self.max_model_len)
        fits = f"{full} sequences of the full {self.max_model_len}-token context"
        if self.max_model_len > _EXAMPLE_TOKENS:
            fits += f" or {self.sequences_of(_EXAMPLE_TOKENS)} of {_EXAMPLE_TOKENS} tokens"
        gpu = (
            ", --gpu-memory-utilization the share of the GPU it may take"
            if "cuda" in (self.device)
            else ""
        )
        state = ""
        if self.state_bytes:
            state = (
                f"; recurrent state {_size(self.state_bytes)} a sequence, "
                f"{_size(self.state_bytes * self.max_num_seqs)} for {self.max_num_seqs}"
            )
        return (
            f"weights {_size(self.weights_bytes)} on {self.device}; KV cache {self.kv_blocks} "
            f"blocks of {self.block_size} = {self.kv_tokens} tokens ({self.kv_dtype}, "
            f"{_size(self.kv_token_bytes)} a token, {_size(self.kv_token_bytes * self.kv_tokens)}"
            f"), {self.sized_by}{state}. It holds {fits} (prompt + max_tokens; a request without "
            f"max_tokens reserves the full context); at most {self.max_num_seqs} run at once "
            "and the rest wait. --max-num-seqs sets how many run at once, --max-model-len the "
            "longest context, --kv-cache-blocks the pool's size, --kv-cache-dtype its bytes a "
            f"token{gpu}."
        )


def plan_capacity(
    cfg: EngineConfig, mc: ModelConfig, model, kv_dtype: torch.dtype, max_model_len: int
) -> CapacityPlan:
    """Size the KV pool for `model` (--kv-cache-blocks, else max_num_seqs full contexts within
    the budget of met.engine.kv_budget) and describe the result."""
    element = torch.empty((), dtype=kv_dtype).element_size()
    shape = pool_shape(mc, element, cfg.block_size, max_model_len, cfg.tensor_parallel_size)
    blocks, sized_by = _pool_blocks(cfg, mc, model, shape)
    return CapacityPlan(
        device=str(model.device),
        weights_bytes=weight_bytes(model),
        kv_dtype=str(kv_dtype).removeprefix("torch."),
        kv_token_bytes=shape.block_bytes // cfg.block_size,
        kv_blocks=blocks,
        block_size=cfg.block_size,
        max_num_seqs=cfg.max_num_seqs,
        max_model_len=max_model_len,
        sized_by=sized_by,
        state_bytes=_state_bytes(mc, model),
    )


def _state_bytes(mc: ModelConfig, model) -> int:
    recurrent = getattr(model, "recurrent_layers", None)
    return state_bytes(mc.recurrent, len(recurrent), model.dtype) if recurrent else 0


def _pool_blocks(cfg: EngineConfig, mc: ModelConfig, model, shape: PoolShape) -> tuple[int, str]:
    """The pool's size in blocks, and how it was chosen, in words naming the flag."""
    if cfg.kv_cache_blocks:
        return cfg.kv_cache_blocks, "as --kv-cache-blocks sets"
    if model.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(model.device)
        activations = torch.empty((), dtype=model.dtype).element_size()
        reserve = activation_reserve(mc, activations, cfg.max_batch_tokens, cfg.max_num_seqs)
        budget = gpu_budget(total, free, cfg.gpu_memory_utilization, reserve)
        within = (
            f"within --gpu-memory-utilization {cfg.gpu_memory_utilization:g} of the GPU, "
            f"after the weights, other processes and {reserve >> 20} MiB for activations"
        )
    else:
        budget = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
        within = "within a quarter of RAM, committed only as blocks are first written"
    blocks = pool_blocks(shape, cfg.max_num_seqs, budget)
    seqs = cfg.max_num_seqs
    if blocks >= shape.context_blocks * seqs:
        return blocks, f"room for --max-num-seqs {seqs} full contexts {within}"
    if blocks * shape.block_bytes > budget:
        return blocks, f"one full context, the least it takes, though over the budget {within}"
    return blocks, f"capped {within} (short of --max-num-seqs {seqs} full contexts)"
