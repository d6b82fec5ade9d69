"""How many KV blocks the engine's pool gets, on the CPU and on a GPU.

The pool is sized for `max_num_seqs` full contexts, within a budget: on the CPU a quarter of RAM
(the pool is committed page by page as blocks are written, so the budget costs nothing until it
is used); on a GPU the share of the device `gpu_memory_utilization` allows, less what is already
in use (the weights, other processes) and a reserve for one step's activations and the decode
graphs. It never goes below one full context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from met.model.config import ModelConfig
from met.model.kv_cache import layer_kv_shapes

# cuBLAS workspaces, the CUDA context's own allocations made after this point, allocator slack.
_GPU_SLACK_BYTES = 512 << 20


@dataclass(frozen=True)
class PoolShape:
    """What one block of this engine's pool costs and how many blocks make one full context."""

    block_bytes: int
    context_blocks: int


def pool_shape(
    mc: ModelConfig, element: int, block_size: int, max_model_len: int, tp_size: int
) -> PoolShape:
    # This rank's share of each layer's KV heads; a shared-KV layer (Gemma 4) and a
    # recurrent one (a hybrid's) store nothing.
    owned = [shape for shape in layer_kv_shapes(mc, tp_size) if shape is not None]
    per_token = 2 * sum(n_kv * dim for n_kv, dim in owned) * element
    return PoolShape(per_token * block_size, math.ceil(max_model_len / block_size) + 1)


KV_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def kv_dtype(setting: str, model_dtype: torch.dtype, cpp_cpu_forward: bool) -> torch.dtype:
    """The KV pool's dtype for `setting` (EngineConfig.kv_cache_dtype)."""
    if setting == "auto":
        return torch.float16 if cpp_cpu_forward else model_dtype
    if setting not in KV_DTYPES:
        raise ValueError(f"kv_cache_dtype: auto, {', '.join(KV_DTYPES)}; not {setting!r}")
    return KV_DTYPES[setting]


def pool_blocks(shape: PoolShape, max_num_seqs: int, budget_bytes: int) -> int:
    wanted = shape.context_blocks * max_num_seqs
    return max(shape.context_blocks, min(wanted, budget_bytes // shape.block_bytes))


def activation_reserve(
    mc: ModelConfig, element: int, max_batch_tokens: int, max_num_seqs: int
) -> int:
    """Bytes one forward's activations may need at their peak (a whole max_batch_tokens step:
    QKV, the gate/up output and its product, a few hidden-size buffers, float32 logits of every
    row and the sampler's copies of them), plus the decode graphs' and libraries' slack."""
    widths = (mc.n_heads + 2 * mc.n_kv_heads) * mc.head_dim + 3 * mc.ffn + 6 * mc.hidden
    logits = 3 * max_num_seqs * mc.vocab * 4
    return max_batch_tokens * widths * element + logits + _GPU_SLACK_BYTES


def gpu_budget(total: int, free: int, utilization: float, reserve: int) -> int:
    """Bytes the KV pool may take: `utilization` of the device, less what every process already
    holds (total - free) and the activation reserve; raises when nothing is left."""
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {utilization}")
    budget = int(total * utilization) - (total - free) - reserve
    if budget <= 0:
        gib = 1 << 30
        raise ValueError(
            f"GPU memory: {utilization:.0%} of {total / gib:.1f} GiB leaves no room for the KV "
            f"cache ({(total - free) / gib:.1f} GiB in use, {reserve / gib:.1f} GiB kept for "
            "activations); raise --gpu-memory-utilization or lower --max-batch-tokens"
        )
    return budget
