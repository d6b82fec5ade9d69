"""The engine's capacity plan in words: what the weights take, how big the KV pool is, how many
sequences of what length it holds, and which flag changes what. Said once at start-up (the
server's ready line) and by `met doctor --model M`, so that "why only 8 at once?" has its answer
before it is asked."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from met.kernels.cpu_quant import QuantLinear

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
    for layer in model.layers:
        weights.extend(layer.values())
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
        return (
            f"weights {_size(self.weights_bytes)} on {self.device}; KV cache {self.kv_blocks} "
            f"blocks of {self.block_size} = {self.kv_tokens} tokens ({self.kv_dtype}, "
            f"{_size(self.kv_token_bytes)} a token, {_size(self.kv_token_bytes * self.kv_tokens)}"
            f"), {self.sized_by}. It holds {fits} (prompt + max_tokens; a request without "
            f"max_tokens reserves the full context); at most {self.max_num_seqs} run at once "
            "and the rest wait. --max-num-seqs sets how many run at once, --max-model-len the "
            "longest context, --kv-cache-blocks the pool's size, --kv-cache-dtype its bytes a "
            f"token{gpu}."
        )
