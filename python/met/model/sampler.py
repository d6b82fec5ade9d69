"""Host sampling for the rows the scheduler hands over (SampleRow in csrc/include/met/types.h).

Order per row: logit bias, penalties, stop mask, the structured-output mask, then the logprob
distribution is taken; then temperature, top-k, top-p, min-p and the draw. Logprobs therefore
describe the model's distribution as adjusted by the request's bias, penalties and constraint
(a refused token has logprob -inf), before temperature and truncation
(what OpenAI reports: a request's logprobs do not change with its temperature or top_p).

A seeded row draws from a generator seeded by (seed, n_generated), so the same request replays
the same tokens whatever else shares its batches, with no generator state kept between steps.
The draw is the inverse of the row's cumulative distribution at one uniform number: one random
number a row (an exponential race over the vocabulary drew one per token, 17x the time).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass
class RowParams:
    """The sampler's view of met::SamplingParams; the C++ struct's binding works just as well."""

    temperature: float = 0.0
    top_k: int = 0  # 0 or -1: off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = 42  # None: draw from torch's global generator (not reproducible)
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
    """Greedy rows take the argmax; the others draw, all truncations batched over them. Each
    step skips what no row asks for (a step's sampling is on the host's critical path)."""
    drawn = [
        i for i, row in enumerate(rows) if row.params.temperature > 0 and row.params.top_k != 1
    ]
    if len(drawn) < len(rows):
        picks = argmax(logits)
        if not drawn:
            return picks
    else:
        picks = torch.empty(len(rows), dtype=torch.int64, device=logits.device)
    dev = logits.device
    params = [rows[i].params for i in drawn]

    def column(values: Iterable[float]) -> Tensor:
        return torch.tensor(list(values), device=dev, dtype=torch.float32)[:, None]

    scaled = logits if len(drawn) == len(rows) else logits[drawn]
    probs = torch.softmax(scaled / column(p.temperature for p in params), dim=-1)
    probs = _truncate(probs, params)
    if any(p.min_p > 0 for p in params):
        min_p = column(p.min_p for p in params)
        probs = probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
    picks[drawn] = _draw(probs, [rows[i] for i in drawn])
    return picks


def _truncate(probs: Tensor, params: Sequence[Any]) -> Tensor:
    """Zero everything outside each row's top-k and top-p nucleus (the best token always stays)."""
    vocab = probs.shape[-1]
    top_k = [p.top_k if p.top_k > 0 else vocab for p in params]
    top_p = [p.top_p for p in params]
    if all(k >= vocab for k in top_k) and all(tp >= 1.0 for tp in top_p):
        return probs
    dev = probs.device
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=dev)[None, :]
    cut = rank >= torch.tensor(top_k, device=dev)[:, None]
    # Renormalise after top-k so top-p is a share of what top-k kept (vLLM's order).
    kept = sorted_probs.masked_fill(cut, 0.0)
    kept = kept / kept.sum(dim=-1, keepdim=True)
    before = kept.cumsum(dim=-1) - kept  # mass strictly ahead of each token
    cut |= before >= torch.tensor(top_p, device=dev)[:, None]
    cut[:, 0] = False
    return probs.scatter(-1, order, sorted_probs.masked_fill(cut, 0.0))


def _draw(probs: Tensor, rows: Sequence[SampleSpec]) -> Tensor:
    """One token a row, index i with probability p_i / sum(p): the first whose cumulative mass
    reaches (1 - u) of the row's total, u uniform in [0, 1) from the row's own generator. The
    target is above 0, so a token of probability 0 (truncated or masked) is never drawn."""
    cdf = probs.cumsum(dim=-1)
    u = torch.cat([_uniform(row, probs.device) for row in rows])[:, None]
    target = (1.0 - u) * cdf[:, -1:]
    return torch.searchsorted(cdf, target).squeeze(1).clamp_(max=probs.shape[-1] - 1)


def _uniform(row: SampleSpec, device: torch.device) -> Tensor:
    seed = row.params.seed
    gen = None
    if seed is not None:
        gen = torch.Generator(device=device)
        gen.manual_seed((int(seed) * 1_000_003 + row.n_generated) % (2**63))
    return torch.rand(1, generator=gen, device=device, dtype=torch.float64)


def _result(logprobs: Tensor, token: int, top_logprobs: int) -> SampledToken:
    top: list[tuple[int, float]] = []
    if top_logprobs > 0:
        values, ids = logprobs.topk(top_logprobs)
        top = list(zip(ids.tolist(), values.tolist(), strict=True))
    return SampledToken(token, float(logprobs[token]), top)
