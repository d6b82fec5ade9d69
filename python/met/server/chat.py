"""POST /v1/chat/completions: OpenAI's chat shapes onto met.chat's pipeline and back."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from met.chat.pipeline import ChatRun, prepare, render
from met.chat.render import template_messages
from met.chat.types import (
    ChatEvent,
    ChatResult,
    Finish,
    Logprobs,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    Usage,
)
from met.engine.outputs import TokenLogprob
from met.server.body import parse_body
from met.server.chat_request import chat_request, internal_message
from met.server.errors import invalid
from met.server.logprobs import TokenText, chat_logprobs, prompt_logprobs_entries
from met.server.protocol import ChatCompletionBody, ChatMessage, sampling_params
from met.server.served_model import ServedModel
from met.server.streaming import Envelope, sse_response


async def create_chat_completion(request: Request) -> Response:
    body = parse_body(await request.body(), ChatCompletionBody)
    state = await request.app.state.met.model_for(body.model, request)
    engine = state.engine
    model = state.answer_name(body.model)
    top = _top_logprobs(body)
    requested = body.max_completion_tokens
    params = sampling_params(body, body.max_tokens if requested is None else requested, top)
    prepared = prepare(state, chat_request(body, params))
    run = await ChatRun.start(state, prepared, f"chatcmpl-{uuid.uuid4().hex}", request)
    envelope = Envelope(run.gen.request_id, "chat.completion", model, body.include_usage)
    token_text = TokenText(engine.tokenizer)
    if body.stream:
        envelope.object = "chat.completion.chunk"
        return sse_response(run.gen, _chunks(run, envelope, token_text, top))
    results = await run.collect(request)
    choices = [
        {
            "index": index,
            "message": _message(result),
            "logprobs": chat_logprobs(token_text, result.logprobs, top)
            if top is not None
            else None,
            "finish_reason": result.finish_reason,
        }
        for index, result in enumerate(results)
    ]
    response = {**envelope.chunk(choices), "usage": usage_body(run.usage())}
    if body.prompt_logprobs is not None:
        # vLLM's place for them on this route: the response's, as every choice shares the prompt.
        response["prompt_logprobs"] = prompt_logprobs_entries(token_text, run.prompt_logprobs)
    return JSONResponse(response)


def encode_messages(state: ServedModel, messages: list[ChatMessage]) -> list[int]:
    """Token ids of the chat template applied to `messages` (for /tokenize)."""
    if not messages:
        raise invalid("messages: must not be empty", param="messages")
    internal = [internal_message(i, m) for i, m in enumerate(messages)]
    generic = not state.chat_setup.template_tools
    return render(state.engine, template_messages(internal, generic=generic), {})


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def _message(result: ChatResult) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.content}
    if result.reasoning is not None:
        message["reasoning_content"] = result.reasoning
    if result.tool_calls:
        message["content"] = result.content or None
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in result.tool_calls
        ]
    return message


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
    run: ChatRun, envelope: Envelope, token_text: TokenText, top: int | None
) -> AsyncIterator[dict[str, Any]]:
    for index in range(run.gen.n):
        yield envelope.chunk([_choice(index, {"role": "assistant", "content": ""}, None, None)])
    # Logprobs come with tokens, text only once the parser lets it out: they ride along with
    # the choice's next chunk.
    pending: list[list[TokenLogprob]] = [[] for _ in range(run.gen.n)]
    async for index, event in run.events():
        if isinstance(event, Logprobs):
            pending[index].extend(event.entries)
            continue
        delta, reason = _delta(event)
        logprobs = None
        if top is not None and pending[index]:
            logprobs = chat_logprobs(token_text, pending[index], top)
            pending[index] = []
        yield envelope.chunk([_choice(index, delta, logprobs, reason)])
    if envelope.include_usage:
        yield envelope.usage_chunk(usage_body(run.usage()))


def _delta(event: ChatEvent) -> tuple[dict[str, Any], str | None]:
    if isinstance(event, TextDelta):
        return {"content": event.text}, None
    if isinstance(event, ReasoningDelta):
        return {"reasoning_content": event.text}, None
    if isinstance(event, ToolCallStart):
        call = {
            "index": event.index,
            "id": event.id,
            "type": "function",
            "function": {"name": event.name, "arguments": ""},
        }
        return {"tool_calls": [call]}, None
    if isinstance(event, ToolCallDelta):
        return {
            "tool_calls": [{"index": event.index, "function": {"arguments": event.arguments}}]
        }, None
    assert isinstance(event, Finish)
    return {}, event.reason


def _choice(index: int, delta: dict, logprobs: dict | None, reason: str | None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
