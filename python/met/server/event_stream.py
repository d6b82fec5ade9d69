"""Streaming driver shared by the Messages and Responses routes: typed chat events in, an API's
SSE frames out, a heartbeat while nothing comes, the generation closed however it ends."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any, Protocol

from fastapi.responses import StreamingResponse

from met.chat.pipeline import ChatRun
from met.chat.types import (
    ChatEvent,
    ChatResult,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    Usage,
)
from met.server.errors import APIError

log = logging.getLogger("met.server")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Renderer(Protocol):
    def feed(self, event: Any) -> list[bytes]: ...
    def end(self, counts: Usage) -> list[bytes]: ...


async def with_heartbeat(
    events: AsyncIterator[Any], interval_s: float
) -> AsyncIterator[Any | None]:
    """`events`, and None each time `interval_s` passes without one (a long prefill)."""
    pending = asyncio.ensure_future(anext(events))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield None
                continue
            try:
                event = pending.result()
            except StopAsyncIteration:
                return
            yield event
            pending = asyncio.ensure_future(anext(events))
    finally:
        pending.cancel()


async def _choice_events(run: ChatRun) -> AsyncIterator[ChatEvent]:
    async for _index, event in run.events():  # these APIs ask for one choice
        yield event


async def _frames(
    run: ChatRun,
    renderer: Renderer,
    opening: list[bytes],
    heartbeat: Callable[[], bytes] | None,
    on_error: Callable[[APIError], list[bytes]],
    on_done: Callable[[], None] | None,
) -> AsyncIterator[bytes]:
    outcome = "disconnected"  # what is left if the client goes away and we are cancelled
    try:
        for chunk in opening:
            yield chunk
        try:
            async with aclosing(with_heartbeat(_choice_events(run), _HEARTBEAT_S)) as events:
                async for event in events:
                    if event is None:
                        if heartbeat is not None:
                            yield heartbeat()
                        continue
                    for chunk in renderer.feed(event):
                        yield chunk
            for chunk in renderer.end(run.usage()):
                yield chunk
            outcome = run.gen.outcome_label()
            if on_done is not None:
                on_done()
        except APIError as e:
            outcome = "error"
            for chunk in on_error(e):
                yield chunk
        except Exception:
            # The status line is long gone; the error travels in the stream instead.
            log.exception("stream %s failed", run.gen.request_id)
            outcome = "error"
            for chunk in on_error(APIError(500, "Internal server error", code="internal_error")):
                yield chunk
    finally:
        run.gen.close(outcome)


# Anthropic's SDK and Claude Code wait on a quiet connection; a ping at least this often keeps
# a long prefill from looking like a dead server.
_HEARTBEAT_S = 5.0


def stream_response(
    run: ChatRun,
    renderer: Renderer,
    opening: list[bytes],
    *,
    on_error: Callable[[APIError], list[bytes]],
    heartbeat: Callable[[], bytes] | None = None,
    on_done: Callable[[], None] | None = None,
    headers: dict[str, str] | None = None,
) -> StreamingResponse:
    frames = _frames(run, renderer, opening, heartbeat, on_error, on_done)
    return StreamingResponse(
        frames, media_type="text/event-stream", headers={**SSE_HEADERS, **(headers or {})}
    )


def result_events(result: ChatResult) -> list[ChatEvent]:
    """A whole choice as the events a stream would have carried (thinking, text, calls)."""
    events: list[ChatEvent] = []
    if result.reasoning:
        events.append(ReasoningDelta(result.reasoning))
    if result.content:
        events.append(TextDelta(result.content))
    for index, call in enumerate(result.tool_calls):
        events += [ToolCallStart(index, call.id, call.name), ToolCallDelta(index, call.arguments)]
    events.append(Finish(result.finish_reason or "stop", result.stop_sequence))
    return events
