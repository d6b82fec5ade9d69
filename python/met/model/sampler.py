"""Host sampling for the rows the scheduler hands over (SampleRow in csrc/include/met/types.h).

Order per row: logit bias, penalties, stop mask, the structured-output mask, then the logprob
distribution is taken; then temperature, top-k, top-p, min-p and the draw. Logprobs therefore
describe the model's distribution as adjusted by the request's bias, penalties and constraint
(a refused token has logprob -inf), before temperature and truncation
(what OpenAI reports: a request's logprobs do not change with its temperature or top_p).

Temperature, truncation and the draw are met's draw (csrc/cpu/sampling.h, `draw` below): the
semantics of the GPU sampling kernel, whose noise is a pure function of (seed, n_generated,
token). A seeded row therefore replays the same tokens whatever else shares its batches, on the
C++ forward's direct steps, here, and (up to rounding) on the GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from met import _core


@dataclass
class RowParams:
    """The sampler's view of met::SamplingParams; the C++ struct's binding works just as well."""

    temperature: float = 0.0
    top_k: int = 0  # 0 or -1: off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = 42  # None: a seed from torch's global generator (not reproducible)
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Sequence[tuple[int, float]] | dict[int, float] = ()
    top_logprobs: int = -1  # -1: none; 0: the sampled token's only; k: also the k best


@dataclass
class SampleSpec:
    """One logits row to sample. `history` is prompt + output so far (met::Sequence::tokens
    before this pick); the output is history[prompt_len:], or its last `n_generated` ids when
    prompt_len is not given."""

    params: Any  # RowParams or anything with the same attributes
    history: Sequence[int] = ()
    prompt_len: int | None = None
    n_generated: int = 0
    mask_stop: bool = False  # min_tokens not reached: stop tokens may not be drawn
    stop_tokens: Sequence[int] = ()
    # Structured output (met.constraints): the int32 bitmask row [ceil(V/32)] of the tokens the
    # grammar allows next; the others get -inf after the stop mask, so greedy takes the best
    # allowed logit and a draw is from the distribution restricted to the allowed tokens.
    mask: Tensor | None = None


@dataclass
class SampledToken:
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # best first


def argmax(logits: Tensor) -> Tensor:
    """Greedy picks [R] (int64) on the logits' own device."""
    return logits.argmax(dim=-1)


def sample(logits: Tensor, rows: Sequence[SampleSpec]) -> list[SampledToken]:
    """One token per row of `logits` [R, V] (float32), in row order."""
    if logits.shape[0] != len(rows):
        raise ValueError(f"{logits.shape[0]} logits rows for {len(rows)} sample rows")
    logits = logits.float().clone()
    for i, row in enumerate(rows):
        _adjust(logits[i], row)
    masked = [i for i, row in enumerate(rows) if row.mask is not None]
    if masked:
        apply_masks(logits, masked, [rows[i].mask for i in masked])
    tokens = _pick(logits, rows).tolist()
    out = [SampledToken(token, math.nan) for token in tokens]
    # Only the rows that asked for logprobs pay for them (the others report NaN, unread).
    wanted = [i for i, row in enumerate(rows) if row.params.top_logprobs >= 0]
    if wanted:
        logprobs = torch.log_softmax(logits[wanted], dim=-1)
        for j, i in enumerate(wanted):
            out[i] = _result(logprobs[j], tokens[i], rows[i].params.top_logprobs)
    return out


def apply_masks(logits: Tensor, index: list[int], masks: list[Tensor]) -> None:
    """-inf, in place, on every token the rows' bitmasks refuse (one vectorised op, no loop over
    the vocabulary). A row left with no token at all (an unmet min_tokens masked the stop tokens
    that are all a complete value allows) is left as it was."""
    words = torch.stack(masks).to(logits.device, non_blocking=True)
    bits = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((words[:, :, None] >> bits) & 1).bool().reshape(len(index), -1)
    allowed = allowed[:, : logits.shape[1]]
    rows = torch.tensor(index, device=logits.device)
    before = logits.index_select(0, rows)
    constrained = before.masked_fill(~allowed, float("-inf"))
    alive = torch.isfinite(constrained).any(dim=-1, keepdim=True)
    logits.index_copy_(0, rows, torch.where(alive, constrained, before))


def _adjust(row_logits: Tensor, row: SampleSpec) -> None:
    """Bias, penalties and stop mask, in place on one row."""
    p = row.params
    bias = p.logit_bias.items() if isinstance(p.logit_bias, dict) else p.logit_bias
    for token, value in bias:
        row_logits[int(token)] += float(value)
    dev = row_logits.device
    if p.repetition_penalty != 1.0 and len(row.history):
        # HF/vLLM: every token seen in prompt or output is made less likely, whatever its sign.
        seen = torch.tensor(sorted(set(row.history)), device=dev, dtype=torch.long)
        vals = row_logits[seen]
        row_logits[seen] = torch.where(
            vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty
        )
    output = _output_tokens(row)
    if output and (p.presence_penalty or p.frequency_penalty):
        # OpenAI: only generated tokens count, presence once, frequency per occurrence.
        ids = torch.tensor(output, device=dev, dtype=torch.long)
        counts = torch.bincount(ids, minlength=row_logits.shape[0]).to(row_logits.dtype)
        row_logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
    if row.mask_stop and len(row.stop_tokens):
        row_logits[torch.tensor(list(row.stop_tokens), device=dev, dtype=torch.long)] = float(
            "-inf"
        )


def _output_tokens(row: SampleSpec) -> list[int]:
    if row.prompt_len is not None:
        return list(row.history[row.prompt_len :])
    return list(row.history[len(row.history) - row.n_generated :]) if row.n_generated else []


def _pick(logits: Tensor, rows: Sequence[SampleSpec]) -> Tensor:
    """Greedy rows take the argmax; the others are drawn by met's draw (csrc/cpu/sampling.h).
    Each step skips what no row asks for (a step's sampling is on the host's critical path)."""
    drawn = [
        i for i, row in enumerate(rows) if row.params.temperature > 0 and row.params.top_k != 1
    ]
    if len(drawn) < len(rows):
        picks = argmax(logits)
        if not drawn:
            return picks
    else:
        picks = torch.empty(len(rows), dtype=torch.int64, device=logits.device)
    params = draw_params([rows[i].params for i in drawn], [rows[i].n_generated for i in drawn])
    tokens = draw(logits, drawn, params)
    picks[drawn] = tokens.to(device=picks.device, dtype=picks.dtype)
    return picks


def draw_params(params: Sequence[Any], steps: Sequence[int]) -> dict[str, np.ndarray]:
    """The per-row arrays of met's draw, and of the GPU kernel (which takes the 64-bit seeds
    and steps as int64 bits): `params` are RowParams or met::SamplingParams, `steps` each
    row's output count so far."""

    def seed(p: Any) -> int:
        if p.seed is not None:
            return int(p.seed) % 2**64
        return int(torch.randint(0, 2**62, (1,)).item())

    return {
        "temperature": np.array([p.temperature for p in params], np.float32),
        "top_k": np.array([max(p.top_k, 0) for p in params], np.int32),
        "top_p": np.array([p.top_p for p in params], np.float32),
        "min_p": np.array([p.min_p for p in params], np.float32),
        "seed": np.array([seed(p) for p in params], np.uint64).view(np.int64),
        "step": np.array(steps, np.int64),
    }


def draw(logits: Tensor, rows: Sequence[int], params: dict[str, np.ndarray]) -> Tensor:
    """met's draw (csrc/cpu/sampling.h) of logits rows `rows`, int32 tokens on the host; logits
    elsewhere than the host are read back first."""
    host = logits.detach().to(device="cpu", dtype=torch.float32).contiguous()
    return torch.from_numpy(_core.cpu.sample(host.numpy(), np.asarray(rows, np.int64), **params))


def _result(logprobs: Tensor, token: int, top_logprobs: int) -> SampledToken:
    top: list[tuple[int, float]] = []
    if top_logprobs > 0:
        values, ids = logprobs.topk(top_logprobs)
        top = list(zip(ids.tolist(), values.tolist(), strict=True))
    return SampledToken(token, float(logprobs[token]), top)
