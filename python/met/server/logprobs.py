"""Logprobs in the two OpenAI shapes: legacy completions and chat."""

from __future__ import annotations

from typing import Any

from met.engine.outputs import TokenLogprob


class TokenText:
    """Token id -> its text, cached: the same ids come back in every top-k list."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self._tokenizer.decode([token_id])
        return text


class LegacyLogprobs:
    """The completions format; text_offset keeps counting across streamed chunks."""

    def __init__(self, token_text: TokenText, offset: int, top: int) -> None:
        self._text = token_text
        self._offset = offset
        self._top = top

    def format(
        self,
        logprobs: list[TokenLogprob],
        prompt_ids: list[int] | None = None,
        prompt: list[TokenLogprob | None] | None = None,
    ) -> dict[str, list]:
        """Generated tokens' logprobs; with the prompt's ids and logprobs (echo), the prompt's
        tokens first (the first one without a logprob: nothing precedes it)."""
        out: dict[str, list] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        if prompt_ids and prompt:
            for token_id, lp in zip(prompt_ids, prompt, strict=True):
                self._prompt_token(out, token_id, lp)
        for lp in logprobs:
            token = self._text(lp.token_id)
            out["tokens"].append(token)
            out["token_logprobs"].append(lp.logprob)
            top = {self._text(tid): value for tid, value in lp.top[: self._top]}
            top.setdefault(token, lp.logprob)
            out["top_logprobs"].append(top)
            out["text_offset"].append(self._offset)
            self._offset += len(token)
        return out

    def _prompt_token(self, out: dict[str, list], token_id: int, lp: TokenLogprob | None) -> None:
        token = self._text(token_id)
        out["tokens"].append(token)
        out["text_offset"].append(self._offset)
        self._offset += len(token)
        if lp is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            return
        top = {self._text(tid): v for tid, v in lp.top[: self._top]}
        top.setdefault(token, lp.logprob)
        out["token_logprobs"].append(lp.logprob)
        out["top_logprobs"].append(top)


def prompt_logprobs_entries(
    token_text: TokenText, entries: list[TokenLogprob | None] | None
) -> list[dict[str, dict] | None] | None:
    """vLLM's prompt_logprobs: per prompt token, None for the first, else {token id: {logprob,
    rank, decoded_token}} for the prompt token and its best alternatives."""
    if entries is None:
        return None
    out: list[dict[str, dict] | None] = []
    for lp in entries:
        if lp is None:
            out.append(None)
            continue
        item = {
            str(lp.token_id): {
                "logprob": lp.logprob,
                "rank": lp.rank,
                "decoded_token": token_text(lp.token_id),
            }
        }
        for rank, (tid, value) in enumerate(lp.top, start=1):
            item.setdefault(
                str(tid), {"logprob": value, "rank": rank, "decoded_token": token_text(tid)}
            )
        out.append(item)
    return out


def chat_logprobs(token_text: TokenText, logprobs: list[TokenLogprob], top: int) -> dict:
    def entry(token_id: int, value: float) -> dict:
        token = token_text(token_id)
        return {"token": token, "logprob": value, "bytes": list(token.encode("utf-8"))}

    content = []
    for lp in logprobs:
        item = entry(lp.token_id, lp.logprob)
        item["top_logprobs"] = [entry(tid, value) for tid, value in lp.top[:top]]
        content.append(item)
    return {"content": content}
