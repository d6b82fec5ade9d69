"""POST /v1/responses, GET and DELETE /v1/responses/{id}: the Responses API over the chat
pipeline. Errors keep OpenAI's shape (the app's handlers)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from met.chat.pipeline import ChatRun, prepare
from met.chat.types import ChatMessage, ChatResult
from met.server.body import parse_body
from met.server.errors import APIError
from met.server.event_stream import SSE_HEADERS, result_events, stream_response
from met.server.responses.convert import Converted, input_messages, to_chat_request
from met.server.responses.protocol import Item, ResponsesBody
from met.server.responses.render import ResponseRenderer, new_id
from met.server.responses.store import ResponseStore


def _store(request: Request) -> ResponseStore:
    return request.app.state.responses


async def create_response(request: Request) -> Response:
    body = parse_body(await request.body(), ResponsesBody)
    state = await request.app.state.met.model_for(body.model, request)
    model = state.answer_name(body.model)
    converted = to_chat_request(body, _previous(request, body.previous_response_id))
    renderer = ResponseRenderer(_envelope(body, model), converted.names)
    try:
        prepared = prepare(state, converted.request)
    except APIError as e:
        if body.stream and e.code == "context_length_exceeded":
            return _failed_stream(renderer, e)
        raise
    run = await ChatRun.start(state, prepared, renderer.envelope["id"], request)
    keep = body.store is not False

    def store() -> None:
        if keep:
            _store(request).put(renderer.response(), _conversation(converted, renderer))

    if body.stream:
        return stream_response(
            run,
            renderer,
            renderer.start(),
            on_error=lambda e: renderer.fail(e.code or e.kind, e.message),
            on_done=store,
        )
    result: ChatResult = (await run.collect(request))[0]
    for event in result_events(result):
        renderer.feed(event)
    renderer.end(run.usage())
    store()
    return JSONResponse(renderer.response())


async def get_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    stored = _store(request).get(response_id)
    if stored is None:
        raise _not_found(response_id)
    return JSONResponse(stored.response)


async def delete_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    if not _store(request).delete(response_id):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


def _not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(
        404, f"No response with id '{response_id}' is stored", param=param, code="not_found"
    )


def _previous(request: Request, response_id: str | None) -> list[ChatMessage]:
    if response_id is None:
        return []
    stored = _store(request).get(response_id)
    if stored is None:
        raise _not_found(response_id, "previous_response_id")
    return stored.conversation


def _conversation(converted: Converted, renderer: ResponseRenderer) -> list[ChatMessage]:
    """The input and this response's output as messages, for a later previous_response_id."""
    items = [Item.model_validate(item, strict=False) for item in renderer.output]
    return [*converted.history, *input_messages(items)]


def _envelope(body: ResponsesBody, model: str) -> dict[str, Any]:
    """The response object's fields that echo the request."""
    fmt = (
        body.text.format.model_dump(by_alias=True, exclude_none=True)
        if body.text and body.text.format
        else {"type": "text"}
    )
    return {
        "id": new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
        "store": body.store is not False,
        "temperature": body.temperature if body.temperature is not None else 1.0,
        "text": {"format": fmt},
        "tool_choice": body.tool_choice or "auto",
        "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
        "top_p": body.top_p if body.top_p is not None else 1.0,
        "truncation": body.truncation or "disabled",
        "metadata": body.metadata or {},
        "background": False,
    }


def _failed_stream(renderer: ResponseRenderer, error: APIError) -> StreamingResponse:
    async def frames():
        for chunk in renderer.start() + renderer.fail(
            error.code or "invalid_request_error", error.message
        ):
            yield chunk

    return StreamingResponse(frames(), media_type="text/event-stream", headers=SSE_HEADERS)
