"""POST /v1/requests/{id}/cancel: end a running request by the id its response carries.

For clients that cannot close their connection to stop a request (behind a proxy that keeps the
upstream open, or having lost the socket): the request's stream ends at once with the text and
usage so far, and its KV blocks are freed. The route sits behind the same API key as the rest.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from met.server.errors import APIError
from met.server.state import ServerState


async def cancel_request(request: Request, request_id: str) -> JSONResponse:
    state: ServerState = request.app.state.met
    for generation in list(state.generations):
        if generation.request_id == request_id:
            generation.cancel()
            return JSONResponse({"id": request_id, "object": "request.cancel", "cancelled": True})
    raise APIError(
        404,
        f"No running request has the id '{request_id}' (it is unknown or already finished)",
        param="request_id",
        code="request_not_found",
    )
