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

    def format(self, logprobs: list[TokenLogprob]) -> dict[str, list]:
        out: dict[str, list] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
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
