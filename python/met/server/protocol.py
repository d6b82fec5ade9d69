"""Request bodies of the OpenAI-compatible API, and their translation into SamplingParams."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from met.constraints import grammar_kind
from met.sampling import Constraint, SamplingParams
from met.server.body import Body
from met.server.errors import from_value_error, invalid

MAX_N = 16  # choices per request; each one is a sequence holding KV blocks
MAX_STOP = 4


class StreamOptions(Body):
    include_usage: bool | None = None


class JsonSchemaFormat(Body):
    name: str | None = None
    # "schema" would shadow a BaseModel attribute.
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Body):
    type: str
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(Body):
    """vLLM's structured_outputs: one of these."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: Any = None  # refused by name rather than ignored


class _GenerationBody(Body):
    model: str | None = None
    n: int | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Structured output, on either endpoint: OpenAI's response_format, vLLM's
    # structured_outputs and its older guided_* fields. At most one constraint per request.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM's: the prompt tokens' logprobs with this many alternatives each.
    prompt_logprobs: int | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionBody(_GenerationBody):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = None
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None


class ContentPart(Body):
    type: str
    text: str | None = None


class FunctionCall(Body):
    name: str
    arguments: str


class MessageToolCall(Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    # Earlier thinking sent back (vLLM's reasoning_content; some clients say reasoning).
    reasoning_content: str | None = None
    reasoning: str | None = None


class ChatCompletionBody(_GenerationBody):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    # Tools are checked by met.server.chat_request, which reports every fault as param "tools".
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    max_thinking_tokens: int | None = None


class TokenizeBody(Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None


class ModelBody(Body):
    model: str


class DetokenizeBody(Body):
    model: str | None = None
    tokens: list[int]


def sampling_params(
    body: _GenerationBody,
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    """Build and range-check the engine's parameters; a bad value becomes a 400 naming it.
    prompt_logprobs: the route's own ask (echo with logprobs), besides the body's field."""
    if body.prompt_logprobs is not None and body.stream:
        raise invalid("prompt_logprobs: not available when streaming", param="prompt_logprobs")
    asks = [k for k in (prompt_logprobs, body.prompt_logprobs) if k is not None]
    if body.n is not None and body.n > MAX_N:
        raise invalid(f"n: must be at most {MAX_N}", param="n")
    if body.stream_options is not None and not body.stream:
        raise invalid("stream_options: only allowed when stream is true", param="stream_options")
    params = SamplingParams(
        n=_or(body.n, 1),
        max_tokens=max_tokens,
        min_tokens=_or(body.min_tokens, 0),
        temperature=_or(body.temperature, 1.0),
        top_p=_or(body.top_p, 1.0),
        top_k=_or(body.top_k, 0),
        min_p=_or(body.min_p, 0.0),
        seed=body.seed,
        presence_penalty=_or(body.presence_penalty, 0.0),
        frequency_penalty=_or(body.frequency_penalty, 0.0),
        repetition_penalty=_or(body.repetition_penalty, 1.0),
        logit_bias=_logit_bias(body.logit_bias),
        stop=_stop_strings(body.stop),
        ignore_eos=bool(body.ignore_eos),
        logprobs=logprobs,
        prompt_logprobs=max(asks) if asks else None,
    )
    _structured_output(body, params)
    try:
        params.validate()
    except ValueError as e:
        raise from_value_error(e) from None
    return params


def _structured_output(body: _GenerationBody, params: SamplingParams) -> None:
    """The request's one structured-output constraint onto the engine's parameters (compiled
    by SamplingParams.validate: a keyword llguidance cannot enforce is a 400 naming it)."""
    given = _response_format(body.response_format)
    given += _vllm_constraints(body.structured_outputs, "structured_outputs.")
    given += _vllm_constraints(body, "guided_")
    if len(given) > 1:
        first, second = given[0].param, given[1].param
        raise invalid(
            f"{second}: give one structured-output constraint, not both {first} and {second}",
            param=second,
        )
    params.constraint = given[0] if given else None


def _response_format(fmt: ResponseFormat | None) -> list[Constraint]:
    if fmt is None or fmt.type == "text":
        return []
    if fmt.type == "json_object":
        return [Constraint("json_object", None, "response_format")]
    if fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise invalid(
                "response_format.json_schema.schema: a JSON schema is required",
                param="response_format.json_schema.schema",
            )
        return [Constraint("json_schema", fmt.json_schema.schema_, "response_format")]
    raise invalid(
        f"response_format: type '{fmt.type}' is not supported; "
        "'text', 'json_object' and 'json_schema' are",
        param="response_format",
    )


def _vllm_constraints(fields: Any, prefix: str) -> list[Constraint]:
    """vLLM's constraint fields of `fields` (structured_outputs.json / guided_json, ...)."""
    if fields is None:
        return []
    out = []
    if prefix == "structured_outputs.":
        if fields.structural_tag is not None:
            raise invalid(
                f"{prefix}structural_tag: is not supported", param=prefix + "structural_tag"
            )
        if fields.json_object:
            out.append(Constraint("json_object", None, prefix + "json_object"))
    schema = fields.json_ if prefix == "structured_outputs." else fields.guided_json
    if schema is not None:
        out.append(Constraint("json_schema", _schema(schema, prefix + "json"), prefix + "json"))
    for name in ("regex", "choice", "grammar"):
        value = getattr(fields, name if prefix == "structured_outputs." else prefix + name)
        if value is None:
            continue
        kind = grammar_kind(value) if name == "grammar" else name
        out.append(Constraint(kind, value, prefix + name))
    return out


def _schema(value: dict[str, Any] | str, param: str) -> dict[str, Any]:
    """vLLM takes a schema as an object or as its JSON text."""
    if isinstance(value, dict):
        return value
    try:
        schema = json.loads(value)
    except ValueError as e:
        raise invalid(f"{param}: the schema is not valid JSON ({e})", param=param) from None
    if not isinstance(schema, dict):
        raise invalid(f"{param}: a JSON schema must be an object", param=param)
    return schema


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _logit_bias(raw: dict[str, float] | None) -> dict[int, float]:
    bias: dict[int, float] = {}
    for key, value in (raw or {}).items():
        try:
            bias[int(key)] = value
        except ValueError:
            raise invalid(f"logit_bias: key {key!r} is not a token id", "logit_bias") from None
    return bias


def _stop_strings(stop: str | list[str] | None) -> list[str]:
    strings = [stop] if isinstance(stop, str) else list(stop or [])
    if len(strings) > MAX_STOP:
        raise invalid(f"stop: at most {MAX_STOP} stop strings are supported", param="stop")
    if any(s == "" for s in strings):
        raise invalid("stop: stop strings must not be empty", param="stop")
    return strings
