"""POST /v1/completions: a text or token-id prompt, legacy logprobs, echo."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from met.server.body import parse_body
from met.server.errors import invalid
from met.server.generation import Generation, fit_max_tokens, public_finish_reason
from met.server.logprobs import LegacyLogprobs, TokenText, prompt_logprobs_entries
from met.server.protocol import CompletionBody, sampling_params
from met.server.streaming import Envelope, sse_response

_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy endpoint


async def create_completion(request: Request) -> Response:
    body = parse_body(await request.body(), CompletionBody)
    state = await request.app.state.met.model_for(body.model, request)
    engine = state.engine
    model = state.answer_name(body.model)
    _reject_unsupported(body)
    prompt_ids, prompt_text = _prompt(engine, body.prompt)
    requested = _DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    # Echo with logprobs returns the prompt's logprobs too (what evaluation harnesses read).
    scored = body.logprobs if body.echo else None
    params = sampling_params(body, requested, body.logprobs, scored)
    params.max_tokens = fit_max_tokens(
        len(prompt_ids), params.max_tokens, engine.max_model_len, "prompt"
    )
    gen = Generation(state, f"cmpl-{uuid.uuid4().hex}", prompt_ids, params)
    await gen.start(request)
    envelope = Envelope(gen.request_id, "text_completion", model, body.include_usage)
    echo = prompt_text if body.echo else ""
    token_text = TokenText(engine.tokenizer)
    if body.stream:
        return sse_response(gen, _chunks(gen, envelope, echo, token_text, body.logprobs))
    results = await gen.collect(request)
    choices = []
    for index, result in enumerate(results):
        logprobs = None
        if body.logprobs is not None:
            formatter = LegacyLogprobs(token_text, 0 if body.echo else len(echo), body.logprobs)
            logprobs = formatter.format(result.logprobs, prompt_ids, result.prompt_logprobs)
        choice = _choice(index, echo + "".join(result.text), logprobs, result.finish_reason)
        if body.prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs_entries(token_text, result.prompt_logprobs)
        choices.append(choice)
    response = {**envelope.chunk(choices), "usage": gen.usage()}
    return JSONResponse(response)


def _reject_unsupported(body: CompletionBody) -> None:
    if body.suffix:
        raise invalid("suffix: not supported", param="suffix")
    if body.best_of is not None and body.best_of != (body.n or 1):
        raise invalid("best_of: only best_of equal to n is supported", param="best_of")


def _prompt(engine: Any, prompt: str | list[int] | list[str] | list[list[int]]) -> tuple:
    """(token ids, prompt text) of the one prompt a request may carry."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise invalid("prompt: only one prompt per request is supported", param="prompt")
        prompt = prompt[0]
    if len(prompt) == 0:
        raise invalid("prompt: must not be empty", param="prompt")
    if isinstance(prompt, str):
        return engine.tokenizer.encode(prompt), prompt
    vocab = engine.tokenizer.vocab_size
    if any(not 0 <= t < vocab for t in prompt):
        raise invalid(f"prompt: token ids must be in [0, {vocab})", param="prompt")
    return list(prompt), engine.tokenizer.decode(prompt)


async def _chunks(
    gen: Generation, envelope: Envelope, echo: str, token_text: TokenText, top: int | None
) -> AsyncIterator[dict[str, Any]]:
    # With logprobs, each choice's echo waits for its first delta, which brings the prompt's.
    scored = bool(echo) and top is not None
    offset = 0 if scored else len(echo)
    formatters = [LegacyLogprobs(token_text, offset, top or 0) for _ in range(gen.n)]
    if echo and not scored:
        for index in range(gen.n):
            yield envelope.chunk([_choice(index, echo, None, None)])
    async for index, delta in gen.deltas():
        if scored and delta.prompt_logprobs is not None:
            prompt = formatters[index].format([], gen.prompt_ids, delta.prompt_logprobs)
            yield envelope.chunk([_choice(index, echo, prompt, None)])
        reason = public_finish_reason(delta.finish_reason, gen.request_id)
        if reason == "abort":
            gen.raise_if_aborted()
        if not (delta.text or delta.logprobs or delta.finished):
            continue
        logprobs = formatters[index].format(delta.logprobs or []) if top is not None else None
        yield envelope.chunk([_choice(index, delta.text, logprobs, reason)])
    if envelope.include_usage:
        yield envelope.usage_chunk(gen.usage())


def _choice(index: int, text: str, logprobs: dict | None, reason: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}
