"""OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}}, never a traceback."""

from __future__ import annotations

import logging
import re
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

log = logging.getLogger("met.server")

# pydantic puts union member tags ("str", "list[int]", model class names) into error locations;
# they are not request fields, so the reported param stops before the first one.
_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|dict|list)$|[\[\]<>-]|^[A-Z]")
_PARAM_PREFIX = re.compile(r"^([A-Za-z_][\w.\[\]]*): (.+)$", re.S)


class ClientDisconnectedError(Exception):
    """The client went away before its response was ready."""


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = headers

    def body(self) -> dict[str, str | None]:
        return {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}

    def response(self) -> JSONResponse:
        return error_response(
            self.status, self.message, self.kind, self.param, self.code, self.headers
        )


def error_response(
    status: int,
    message: str,
    kind: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def from_value_error(error: ValueError, code: str | None = None) -> APIError:
    """Turn the "<param>: <why>" messages of SamplingParams.validate and the engine into a 400."""
    text = str(error)
    match = _PARAM_PREFIX.match(text)
    param = match.group(1) if match else None
    if code is None and re.search(r"context|too long|max_model_len", text):
        code = "context_length_exceeded"
    return APIError(400, text, param=param, code=code)


def from_validation_error(error: ValidationError) -> APIError:
    first = error.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return invalid(f"Invalid JSON body: {first['msg'].removeprefix('Invalid JSON: ')}")
    param = location_to_param(first["loc"])
    if param is None:
        return invalid(f"Request body: {first['msg']}")
    return invalid(f"{param}: {first['msg']}", param=param)


def location_to_param(loc: tuple[int | str, ...]) -> str | None:
    param = ""
    for part in loc:
        if isinstance(part, int):
            param += f"[{part}]"
        elif _TYPE_TAG.search(part):
            break
        else:
            param += f".{part}" if param else part
    return param or None


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    app.add_exception_handler(RequestValidationError, _on_request_validation)
    app.add_exception_handler(ClientDisconnectedError, _on_client_gone)
    app.add_exception_handler(ClientDisconnect, _on_client_gone)
    app.add_exception_handler(Exception, _on_unexpected)


async def _on_api_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return exc.response()


async def _on_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    if status == 404:
        message = f"Unknown route: {request.method} {request.url.path}"
    elif status == 405:
        message = f"Method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail) if exc.detail else HTTPStatus(status).phrase
    code = HTTPStatus(status).phrase.lower().replace(" ", "_")
    kind = "invalid_request_error" if status < 500 else "server_error"
    return error_response(status, message, kind, None, code, dict(exc.headers or {}))


async def _on_request_validation(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    param = location_to_param(tuple(errors[0]["loc"][1:])) if errors else None
    message = f"{param}: {errors[0]['msg']}" if errors and param else "Invalid request"
    return error_response(400, message, "invalid_request_error", param)


async def _on_client_gone(_request: Request, _exc: Exception) -> Response:
    # Nobody reads this; the status only shows in the access log and the metrics.
    return Response(status_code=499)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "Internal server error", "server_error", None, "internal_error")
