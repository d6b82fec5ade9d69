"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's API over the chat pipeline."""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from met.chat.pipeline import ChatRun, prepare
from met.sampling import SamplingParams
from met.server.body import parse_body
from met.server.errors import APIError, ClientDisconnectedError
from met.server.event_stream import result_events, stream_response
from met.server.messages.convert import sampling_params, to_chat_request
from met.server.messages.protocol import CountTokensBody, MessagesBody
from met.server.messages.render import MessageRenderer, error_status_and_body, frame

log = logging.getLogger("met.server")

Handler = Callable[[Request], Awaitable[Response]]


def anthropic_error(error: APIError, request_id: str) -> JSONResponse:
    status, body = error_status_and_body(error)
    headers = {**(error.headers or {}), "request-id": request_id}
    return JSONResponse(body, status_code=status, headers=headers)


def _anthropic_shaped(handler: Handler) -> Handler:
    """Errors in Anthropic's shape and a request-id header on every answer of the route."""

    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        request_id = f"req_{uuid.uuid4().hex[:24]}"
        try:
            response = await handler(request)
        except APIError as e:
            return anthropic_error(e, request_id)
        except ClientDisconnectedError:
            raise
        except Exception:
            log.exception("internal error on %s %s", request.method, request.url.path)
            return anthropic_error(APIError(500, "Internal server error"), request_id)
        response.headers["request-id"] = request_id
        return response

    return wrapped


@_anthropic_shaped
async def create_message(request: Request) -> Response:
    body = parse_body(await request.body(), MessagesBody)
    state = await request.app.state.met.model_for(body.model, request)
    model = state.answer_name(body.model)
    prepared = prepare(state, to_chat_request(body, sampling_params(body)))
    message_id = f"msg_{uuid.uuid4().hex}"
    run = await ChatRun.start(state, prepared, message_id, request)
    renderer = MessageRenderer(message_id, model, len(prepared.prompt_ids))
    if body.stream:
        return stream_response(
            run,
            renderer,
            renderer.start(),
            on_error=_error_frames,
            heartbeat=lambda: frame("ping", {"type": "ping"}),
        )
    result = (await run.collect(request))[0]
    for event in result_events(result):
        renderer.feed(event)
    return JSONResponse(renderer.message(run.usage()))


@_anthropic_shaped
async def count_tokens(request: Request) -> Response:
    body = parse_body(await request.body(), CountTokensBody)
    state = await request.app.state.met.model_for(body.model, request)
    # The same conversion and rendering as /v1/messages, so the count is that prompt's length.
    prepared = prepare(state, to_chat_request(body, SamplingParams(max_tokens=1)))
    return JSONResponse({"input_tokens": len(prepared.prompt_ids)})


def _error_frames(error: APIError) -> list[bytes]:
    _status, body = error_status_and_body(error)
    return [frame("error", body)]
