"""The FastAPI application: routes with and without the /v1 prefix, errors, access middleware."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

import met
from met.server.body import parse_body
from met.server.cancel import cancel_request
from met.server.chat import create_chat_completion, encode_messages
from met.server.completions import create_completion
from met.server.embeddings import create_embeddings, create_rerank
from met.server.errors import APIError, install_error_handlers, invalid
from met.server.messages.routes import count_tokens, create_message
from met.server.middleware import AccessMiddleware
from met.server.protocol import DetokenizeBody, ModelBody, TokenizeBody
from met.server.responses.routes import create_response, delete_response, get_response
from met.server.responses.store import ResponseStore
from met.server.settings import ServerSettings
from met.server.state import ServerState
from met.server.webui import install_webui

_CREATED = int(time.time())


def create_app(engine: Any, settings: ServerSettings, state: ServerState | None = None) -> FastAPI:
    """An app serving `engine`, which may still be loading (generation answers 503 until ready)."""
    state = state or ServerState(engine, settings)
    app = FastAPI(
        title="met", version=met.__version__, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.met = state
    app.state.responses = ResponseStore()
    install_error_handlers(app)
    api_routes = {
        "/models": (list_models, ["GET"]),
        "/completions": (create_completion, ["POST"]),
        "/chat/completions": (create_chat_completion, ["POST"]),
        "/messages": (create_message, ["POST"]),
        "/messages/count_tokens": (count_tokens, ["POST"]),
        "/responses": (create_response, ["POST"]),
        "/responses/{response_id}": (get_response, ["GET"]),
        "/requests/{request_id}/cancel": (cancel_request, ["POST"]),
        "/embeddings": (create_embeddings, ["POST"]),
        "/rerank": (create_rerank, ["POST"]),
        "/models/load": (load_model, ["POST"]),
        "/models/unload": (unload_model, ["POST"]),
    }
    # One path, two handlers: added beside the table, which keys routes by path.
    for prefix in ("/v1", ""):
        app.add_api_route(prefix + "/responses/{response_id}", delete_response, methods=["DELETE"])
    for path, (handler, methods) in api_routes.items():
        for prefix in ("/v1", ""):
            app.add_api_route(prefix + path, handler, methods=methods)
    app.add_api_route("/tokenize", tokenize, methods=["POST"])
    app.add_api_route("/detokenize", detokenize, methods=["POST"])
    app.add_api_route("/tokenizer_info", tokenizer_info, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/version", version, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    app.add_api_route("/status", status, methods=["GET"])
    if not settings.no_webui:
        install_webui(app)
    app.add_middleware(AccessMiddleware, state=state)
    return app


def _state(request: Request) -> ServerState:
    return request.app.state.met


async def list_models(request: Request) -> JSONResponse:
    state = _state(request)
    state.require_ready()
    return JSONResponse({"object": "list", "data": state.router.listing(_CREATED)})


async def load_model(request: Request) -> JSONResponse:
    """llama-server's POST /models/load {"model": name}: load it now (unloading the least
    recently used beyond --max-loaded-models)."""
    body = parse_body(await request.body(), ModelBody)
    model = await _state(request).model_for(body.model, request)
    return JSONResponse({"success": True, "model": model.name, "status": model.status})


async def unload_model(request: Request) -> JSONResponse:
    """POST /models/unload {"model": name}: unload it once its requests have finished."""
    body = parse_body(await request.body(), ModelBody)
    state = _state(request)
    model = state.router.find(body.model)
    await state.router.unload(model)
    return JSONResponse({"success": True, "model": model.name, "status": model.status})


async def tokenize(request: Request) -> JSONResponse:
    state = _state(request)
    body = parse_body(await request.body(), TokenizeBody)
    state = await state.model_for(body.model, request)
    engine = state.engine
    if (body.prompt is None) == (body.messages is None):
        raise invalid("Give exactly one of 'prompt' or 'messages'", param="prompt")
    if body.messages is not None:
        tokens = encode_messages(state, body.messages)
    else:
        tokens = engine.tokenizer.encode(body.prompt)
    return JSONResponse(
        {"tokens": tokens, "count": len(tokens), "max_model_len": engine.max_model_len}
    )


async def detokenize(request: Request) -> JSONResponse:
    state = _state(request)
    body = parse_body(await request.body(), DetokenizeBody)
    engine = (await state.model_for(body.model, request)).engine
    vocab = engine.tokenizer.vocab_size
    if any(not 0 <= t < vocab for t in body.tokens):
        raise invalid(f"tokens: token ids must be in [0, {vocab})", param="tokens")
    return JSONResponse({"prompt": engine.tokenizer.decode(body.tokens)})


async def tokenizer_info(request: Request) -> JSONResponse:
    """vLLM's: the special tokens and the chat template, so that a client (lm-evaluation-harness)
    tokenizes through /tokenize with the served model's own tokenizer."""
    engine = (await _state(request).model_for(request.query_params.get("model"), request)).engine
    tok = engine.tokenizer
    return JSONResponse(
        {
            "tokenizer_class": "met",
            "bos_token": tok.bos_token,
            "eos_token": tok.eos_token,
            "pad_token": None,
            "chat_template": tok.chat_template,
            "model_max_length": engine.max_model_len,
        }
    )


async def health(request: Request) -> Response:
    try:
        _state(request).require_ready()
    except APIError as e:
        return e.response()
    return JSONResponse({"status": "ok"})


async def version(_request: Request) -> JSONResponse:
    return JSONResponse({"version": met.__version__})


async def metrics(request: Request) -> Response:
    body, content_type = _state(request).metrics.render(request.headers.get("accept"))
    return Response(body, media_type=content_type)


async def status(request: Request) -> JSONResponse:
    return JSONResponse(_state(request).status())
