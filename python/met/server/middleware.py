"""Outermost ASGI layer: API-key check, one log line and one counter sample per request."""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from met.server.errors import APIError
from met.server.messages.routes import anthropic_error
from met.server.metrics import api_label
from met.server.router import LEASES, ModelRouter
from met.server.state import ServerState

log = logging.getLogger("met.server")

# The chat page loads without a key (a browser cannot send one on navigation); it asks for the
# key and sends it with every API call, which still needs it.
_OPEN_PATHS = frozenset({"/health", "/"})
_OPEN_PREFIXES = ("/webui/",)
_QUIET_PATHS = frozenset({"/health", "/metrics", "/status"})  # polled; logged at debug only
_CLIENT_CLOSED = 499  # nginx's "client closed request"


class AccessMiddleware:
    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state
        key = state.settings.api_key
        self._key = key.encode("utf-8") if key else None
        self._max_body = state.settings.max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status: list[int] = []
        scope.setdefault("state", {})  # shared by reference with every inner copy of the scope

        async def send_and_note(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        refusal = self._refusal(scope)
        if refusal is not None:
            await _error_response(scope, refusal)(scope, receive, send_and_note)
            self._account(scope, refusal.status, started)
            return
        try:
            await self.app(scope, _capped(receive, self._max_body), send_and_note)
        finally:
            code = status[0] if status else 500
            generation = scope.get("state", {}).get("generation")
            if generation is not None:
                # A request never outlives its HTTP exchange, however that exchange ended.
                generation.close("error" if code >= 500 else "disconnected")
                if generation.outcome == "disconnected":
                    code = _CLIENT_CLOSED
            for model in scope.get("state", {}).get(LEASES, []):
                ModelRouter.release(model)
            self._account(scope, code, started)

    def _refusal(self, scope: Scope) -> APIError | None:
        """The error a request gets before anything reads it: no key, or a declared body over
        the limit (one sent without a length is cut off as it arrives, by _capped)."""
        if not self._authorized(scope):
            return APIError(401, "Invalid or missing API key", code="invalid_api_key")
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self._max_body:
                return _too_large(self._max_body)
        return None

    def _authorized(self, scope: Scope) -> bool:
        path = scope["path"]
        if self._key is None or path in _OPEN_PATHS or path.startswith(_OPEN_PREFIXES):
            return True
        # Anthropic's clients send the key as x-api-key; OpenAI's as a bearer token.
        for name, value in scope["headers"]:
            if name == b"x-api-key" and hmac.compare_digest(value.strip(), self._key):
                return True
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key):
                    return True
        return False

    def _account(self, scope: Scope, code: int, started: float) -> None:
        path = scope["path"]
        duration_ms = (time.monotonic() - started) * 1000
        generation = scope.get("state", {}).get("generation")
        if path in _QUIET_PATHS:
            log.debug("%s %s %d %.1fms", scope["method"], path, code, duration_ms)
            return
        finish = generation.outcome if generation is not None else ""
        self.state.metrics.requests.labels(api_label(path), str(code), finish or "").inc()
        log.info("%s", _log_line(scope, code, duration_ms, generation))


def _error_response(scope: Scope, error: APIError) -> Response:
    """The refusal in the shape of the API the path belongs to."""
    if scope["path"].removeprefix("/v1").startswith("/messages"):
        return anthropic_error(error, f"req_{uuid.uuid4().hex[:24]}")
    return error.response()


def _too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"Request body too large: the limit is {limit} bytes (--max-request-bytes)",
        code="request_too_large",
    )


def _capped(receive: Receive, limit: int) -> Receive:
    """`receive` that raises a 413 once more than `limit` body bytes have arrived."""
    seen = 0

    async def capped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _too_large(limit)
        return message

    return capped


def _log_line(scope: Scope, code: int, duration_ms: float, generation: Any) -> str:
    if generation is None:
        rid = f"req-{uuid.uuid4().hex[:12]}"
        return f"{rid} {scope['method']} {scope['path']} status={code} duration={duration_ms:.0f}ms"
    record = generation.record
    ttft = (
        f"{(record.first_token_at - record.arrived) * 1000:.0f}ms"
        if record.first_token_at is not None
        else "-"
    )
    return (
        f"{generation.request_id} {scope['method']} {scope['path']} status={code} "
        f"finish={generation.outcome} prompt_tokens={len(generation.prompt_ids)} "
        f"completion_tokens={sum(generation.completion_tokens)} ttft={ttft} "
        f"duration={duration_ms:.0f}ms"
    )
