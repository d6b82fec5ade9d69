"""POST /v1/embeddings (OpenAI's shape) and /v1/rerank (Jina's and Cohere's, as llama-server and
vLLM serve it), over the model's pooling (met.engine.pooling)."""

from __future__ import annotations

import base64
import struct
import uuid
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse

from met.engine.outputs import EngineDeadError, QueueFullError
from met.engine.pooling import truncate
from met.server.body import Body, parse_body
from met.server.errors import APIError, from_value_error, invalid
from met.server.served_model import ServedModel

MAX_INPUTS = 2048  # OpenAI's limit of inputs per embeddings request
# Qwen3-Reranker's prompt: the model answers "yes" or "no" after the assistant turn opens with
# an empty think block; the score is P(yes) over {yes, no}.
_RERANK_SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".'
)
_DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


class EmbeddingsBody(Body):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class RerankBody(Body):
    model: str | None = None
    query: str
    documents: list[str]
    top_n: int | None = None
    return_documents: bool = True
    instruction: str | None = None  # Qwen3-Reranker's task line


async def create_embeddings(request: Request) -> JSONResponse:
    body = parse_body(await request.body(), EmbeddingsBody)
    served = await request.app.state.met.model_for(body.model, request)
    _require_pooling(served, embeddings=True)
    if body.dimensions is not None and body.dimensions < 1:
        raise invalid("dimensions: must be at least 1", param="dimensions")
    prompts = _prompts(served, body.input)
    vectors = await _pool(served, "embed", prompts)
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(v, body)}
        for i, v in enumerate(vectors)
    ]
    tokens = sum(len(p) for p in prompts)
    served.metrics.prompt_tokens.labels("embeddings").inc(tokens)
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "model": served.answer_name(body.model),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


async def create_rerank(request: Request) -> JSONResponse:
    body = parse_body(await request.body(), RerankBody)
    served = await request.app.state.met.model_for(body.model, request)
    _require_pooling(served, embeddings=False)
    if not body.documents:
        raise invalid("documents: must not be empty", param="documents")
    if body.top_n is not None and body.top_n < 1:
        raise invalid("top_n: must be at least 1", param="top_n")
    tokenizer = served.engine.tokenizer
    yes, no = _answer_token(tokenizer, "yes"), _answer_token(tokenizer, "no")
    instruction = body.instruction or _DEFAULT_INSTRUCTION
    prompts = [
        tokenizer.encode(_rerank_prompt(instruction, body.query, doc)) for doc in body.documents
    ]
    for prompt in prompts:
        _check_length(served, prompt, "documents")
    scores = await _pool(served, "score", prompts, yes, no)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: body.top_n]
    results = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if body.return_documents:
            result["document"] = {"text": body.documents[i]}
        results.append(result)
    tokens = sum(len(p) for p in prompts)
    served.metrics.prompt_tokens.labels("rerank").inc(tokens)
    return JSONResponse(
        {
            "id": f"rerank-{uuid.uuid4().hex}",
            "model": served.answer_name(body.model),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": results,
        }
    )


def _require_pooling(served: ServedModel, embeddings: bool) -> None:
    pooling = served.engine.pooling
    if embeddings and pooling not in (None, "rank"):
        return
    if not embeddings and pooling == "rank":
        return
    what = "an embedding model" if embeddings else "a reranker"
    flag = "--pooling last (or mean, cls)" if embeddings else "--pooling rank"
    raise invalid(
        f"The model '{served.name}' is not {what}: its file names "
        f"{'no pooling' if pooling is None else f'pooling {pooling}'}; serve it with {flag}",
        param="model",
        code="model_not_supported",
    )


def _prompts(served: ServedModel, given: Any) -> list[list[int]]:
    """The input as token lists: a string, strings, token ids or lists of token ids."""
    if isinstance(given, str) or (given and isinstance(given[0], int)):
        given = [given]
    if not given:
        raise invalid("input: must not be empty", param="input")
    if len(given) > MAX_INPUTS:
        raise invalid(f"input: at most {MAX_INPUTS} inputs per request", param="input")
    tokenizer = served.engine.tokenizer
    prompts = []
    for i, item in enumerate(given):
        ids = tokenizer.encode(item, add_special=True) if isinstance(item, str) else item
        if not ids:
            raise invalid(f"input[{i}]: must not be empty", param="input")
        if any(not 0 <= t < served.engine.vocab_size for t in ids):
            raise invalid(f"input[{i}]: token ids must be inside the vocabulary", param="input")
        _check_length(served, ids, "input")
        prompts.append(ids)
    return prompts


def _check_length(served: ServedModel, ids: list[int], param: str) -> None:
    limit = served.engine.max_model_len
    if len(ids) > limit:
        raise invalid(
            f"{param}: {len(ids)} tokens is longer than the model's context of {limit}",
            param=param,
            code="context_length_exceeded",
        )


async def _pool(served: ServedModel, kind: str, prompts: list[list[int]], *extra: int) -> list:
    try:
        return await served.engine.pool(kind, prompts, *extra)
    except ValueError as e:
        raise from_value_error(e) from None
    except QueueFullError as e:
        raise APIError(503, f"Server unavailable: {e}", code="shutting_down") from None
    except EngineDeadError as e:
        raise served.engine_died(e) from None


def _encoded(vector, body: EmbeddingsBody) -> list[float] | str:
    values = truncate(vector, body.dimensions)
    if body.encoding_format == "float":
        return values
    # OpenAI's base64: the little-endian float32 bytes.
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")


def _answer_token(tokenizer: Any, word: str) -> int:
    ids = tokenizer.encode(word)
    if len(ids) != 1:
        raise invalid(
            f"The model's tokenizer has no single '{word}' token, which a reranker's score reads",
            param="model",
            code="model_not_supported",
        )
    return ids[0]


def _rerank_prompt(instruction: str, query: str, document: str) -> str:
    return (
        f"<|im_start|>system\n{_RERANK_SYSTEM}<|im_end|>\n<|im_start|>user\n"
        f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
