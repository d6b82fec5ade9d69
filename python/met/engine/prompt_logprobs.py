"""Prompt logprobs: how likely the model found each prompt token, given the tokens before it.

What evaluation harnesses read (loglikelihood tasks score a continuation by the logprobs of its
tokens as part of the prompt). A request that asks for them has its prefill forwards return the
logits of every prompt position instead of only the last one; every other request's forward is
unchanged. Such a request skips the prefix cache, since cached positions are never computed.
"""

from __future__ import annotations

import torch

from met.engine.outputs import TokenLogprob


class PromptScores:
    """One sequence's prompt logprobs, filled chunk by chunk as its prompt is prefilled.

    Entry p is token p's logprob (with its rank and the `top` best alternatives) under the
    logits at position p - 1; entry 0 has no earlier position and stays None."""

    def __init__(self, prompt: list[int], top: int) -> None:
        self.prompt = list(prompt)
        self.top = top
        self.entries: list[TokenLogprob | None] = [None] * len(prompt)
        self.scored = 1  # positions below this are done (position 0 has nothing to score)

    @property
    def done(self) -> bool:
        return self.scored >= len(self.prompt)

    def wants(self, start: int, n_tokens: int) -> bool:
        """Whether a row writing positions start .. start + n_tokens - 1 scores anything new:
        its logits at position p score prompt token p + 1."""
        return not self.done and start + n_tokens > self.scored - 1 and start < len(self.prompt)

    def add(self, start: int, logits: torch.Tensor) -> None:
        """Logits [n, vocab] of positions start .. start + n - 1 of this sequence."""
        n = logits.shape[0]
        first = max(start, self.scored - 1)
        last = min(start + n, len(self.prompt) - 1)  # exclusive: the final position is sampled
        if last <= first:
            return
        logprobs = torch.log_softmax(logits[first - start : last - start].float(), dim=-1)
        targets = torch.tensor(self.prompt[first + 1 : last + 1], device=logprobs.device)
        chosen = logprobs.gather(1, targets[:, None])[:, 0]
        ranks = (logprobs > chosen[:, None]).sum(dim=-1) + 1
        top_values, top_ids = (
            logprobs.topk(self.top, dim=-1) if self.top > 0 else (chosen[:, None][:, :0],) * 2
        )
        rows = zip(
            targets.tolist(),
            chosen.tolist(),
            ranks.tolist(),
            top_ids.tolist(),
            top_values.tolist(),
            strict=True,
        )
        for offset, (token, value, rank, ids, values) in enumerate(rows):
            top = list(zip(ids, values, strict=True))
            self.entries[first + 1 + offset] = TokenLogprob(token, value, top, rank)
        self.scored = last + 1
