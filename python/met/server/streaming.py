"""Server-sent events: chunk envelopes, framing, and the stream driver that always cleans up."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi.responses import StreamingResponse

from met.server.errors import APIError
from met.server.generation import Generation

log = logging.getLogger("met.server")

SSE_DONE = b"data: [DONE]\n\n"
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(payload: dict[str, Any]) -> bytes:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + data.encode("utf-8") + b"\n\n"


@dataclass
class Envelope:
    """The fields every chunk of one response repeats."""

    id: str
    object: str
    model: str
    include_usage: bool = False
    created: int = 0

    def __post_init__(self) -> None:
        self.created = self.created or int(time.time())

    def chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {**self.chunk([]), "usage": usage}


async def _frames(gen: Generation, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    outcome = "disconnected"  # what is left if the client goes away and we are cancelled
    try:
        try:
            async for chunk in chunks:
                yield sse(chunk)
            outcome = gen.outcome_label()
        except APIError as e:
            outcome = "error"
            yield sse({"error": e.body()})
        except Exception:
            # The status line is long gone; the error travels in the stream instead.
            log.exception("stream %s failed", gen.request_id)
            outcome = "error"
            yield sse(
                {"error": APIError(500, "Internal server error", code="internal_error").body()}
            )
        yield SSE_DONE
    finally:
        gen.close(outcome)


def sse_response(gen: Generation, chunks: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    return StreamingResponse(
        _frames(gen, chunks), media_type="text/event-stream", headers=_SSE_HEADERS
    )
