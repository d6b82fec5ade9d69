"""POST /v1/chat/completions: the model's chat template, chat-format logprobs."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from met.server.errors import invalid
from met.server.generation import Generation, fit_max_tokens, public_finish_reason
from met.server.logprobs import TokenText, chat_logprobs
from met.server.protocol import ChatCompletionBody, ChatMessage, parse_body, sampling_params
from met.server.state import ServerState
from met.server.streaming import Envelope, sse_response

log = logging.getLogger("met.server")


async def create_chat_completion(request: Request) -> Response:
    state: ServerState = request.app.state.met
    engine = state.require_ready()
    body = parse_body(await request.body(), ChatCompletionBody)
    model = state.check_model(body.model)
    _reject_unsupported(body)
    prompt_ids = encode_messages(engine, body.messages)
    top = _top_logprobs(body)
    requested = body.max_completion_tokens
    params = sampling_params(body, body.max_tokens if requested is None else requested, top)
    params.max_tokens = fit_max_tokens(
        len(prompt_ids), params.max_tokens, engine.max_model_len, "messages"
    )
    gen = Generation(state, f"chatcmpl-{uuid.uuid4().hex}", prompt_ids, params)
    await gen.start(request)
    envelope = Envelope(gen.request_id, "chat.completion", model, body.include_usage)
    token_text = TokenText(engine.tokenizer)
    if body.stream:
        envelope.object = "chat.completion.chunk"
        return sse_response(gen, _chunks(gen, envelope, token_text, top))
    results = await gen.collect(request)
    choices = [
        {
            "index": index,
            "message": {"role": "assistant", "content": "".join(result.text)},
            "logprobs": chat_logprobs(token_text, result.logprobs, top)
            if top is not None
            else None,
            "finish_reason": result.finish_reason,
        }
        for index, result in enumerate(results)
    ]
    return JSONResponse({**envelope.chunk(choices), "usage": gen.usage()})


def encode_messages(engine: Any, messages: list[ChatMessage]) -> list[int]:
    """Token ids of the chat template applied to `messages`, generation prompt included."""
    if not messages:
        raise invalid("messages: must not be empty", param="messages")
    plain = []
    for i, message in enumerate(messages):
        content = message.content
        if isinstance(content, list):
            if any(part.type != "text" or part.text is None for part in content):
                raise invalid(
                    f"messages[{i}].content: only text parts are supported",
                    f"messages[{i}].content",
                )
            content = "".join(part.text or "" for part in content)
        role = "system" if message.role == "developer" else message.role
        plain.append({"role": role, "content": content or ""})
    try:
        return engine.tokenizer.encode_chat(plain)
    except ValueError as e:  # the template's own checks (role order, ...) judge the client's input
        log.info("chat template rejected the messages: %s", e)
        raise invalid(f"messages: the chat template rejected them: {e}", "messages") from None


def _reject_unsupported(body: ChatCompletionBody) -> None:
    if body.tools:
        raise invalid("tools: tool calling is not supported", param="tools")


def _top_logprobs(body: ChatCompletionBody) -> int | None:
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid("top_logprobs: requires logprobs to be true", param="top_logprobs")
    if not body.logprobs:
        return None
    top = body.top_logprobs or 0
    if not 0 <= top <= 20:
        raise invalid("top_logprobs: must be in [0, 20]", param="top_logprobs")
    return top


async def _chunks(
    gen: Generation, envelope: Envelope, token_text: TokenText, top: int | None
) -> AsyncIterator[dict[str, Any]]:
    for index in range(gen.n):
        yield envelope.chunk([_choice(index, {"role": "assistant", "content": ""}, None, None)])
    async for index, delta in gen.deltas():
        reason = public_finish_reason(delta.finish_reason, gen.request_id)
        if reason == "abort":
            gen.raise_if_aborted()
        if not (delta.text or delta.logprobs or delta.finished):
            continue
        logprobs = None
        if top is not None and delta.logprobs:
            logprobs = chat_logprobs(token_text, delta.logprobs, top)
        content = {"content": delta.text} if delta.text else {}
        yield envelope.chunk([_choice(index, content, logprobs, reason)])
    if envelope.include_usage:
        yield envelope.usage_chunk(gen.usage())


def _choice(index: int, delta: dict, logprobs: dict | None, reason: str | None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
