"""Bad input gets a small OpenAI-shaped error with the right status, and the server carries on."""

from __future__ import annotations

import json

import openai
import pytest
from server_harness import ServerProcess, start_server

pytestmark = pytest.mark.slow

KEY = "s3cret-key"
MAX_LEN = 256
MAX_BODY = 65536
GOOD_CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.fixture(scope="module")
def server():
    proc = start_server(
        "--max-model-len", str(MAX_LEN), "--max-request-bytes", str(MAX_BODY), api_key=KEY
    )
    yield proc
    assert proc.stop() == 0


def _chat(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


def _cmpl(**fields) -> dict:
    return {"prompt": "hi", "max_tokens": 2, **fields}


CMPL, CHAT = "/v1/completions", "/v1/chat/completions"

# (id, path, body: dict | bytes, status, param, code)
CASES = [
    ("malformed-json", CMPL, b'{"prompt": "hi",', 400, None, None),
    ("empty-body", CMPL, b"", 400, None, None),
    ("array-body", CMPL, b"[1, 2]", 400, None, None),
    ("lone-surrogate", CMPL, b'{"prompt": "a\\ud800b"}', 400, None, None),
    ("invalid-utf8", CMPL, b'{"prompt": "\xff\xfe"}', 400, None, None),
    ("nan-temperature", CMPL, b'{"prompt": "hi", "temperature": NaN}', 400, "temperature", None),
    ("prompt-int", CMPL, {"prompt": 5}, 400, "prompt", None),
    ("prompt-missing", CMPL, {"max_tokens": 2}, 400, "prompt", None),
    ("prompt-empty", CMPL, _cmpl(prompt=""), 400, "prompt", None),
    ("prompt-empty-list", CMPL, _cmpl(prompt=[]), 400, "prompt", None),
    ("prompt-two", CMPL, _cmpl(prompt=["a", "b"]), 400, "prompt", None),
    ("prompt-bad-id", CMPL, _cmpl(prompt=[1, 10**9]), 400, "prompt", None),
    ("max-tokens-str", CMPL, _cmpl(max_tokens="5"), 400, "max_tokens", None),
    ("max-tokens-float", CMPL, _cmpl(max_tokens=5.5), 400, "max_tokens", None),
    ("max-tokens-zero", CMPL, _cmpl(max_tokens=0), 400, "max_tokens", None),
    ("max-tokens-negative", CMPL, _cmpl(max_tokens=-3), 400, "max_tokens", None),
    ("temperature-high", CMPL, _cmpl(temperature=3), 400, "temperature", None),
    ("temperature-negative", CHAT, _chat(temperature=-0.5), 400, "temperature", None),
    ("top-p-zero", CMPL, _cmpl(top_p=0), 400, "top_p", None),
    ("top-p-high", CHAT, _chat(top_p=1.5), 400, "top_p", None),
    ("n-zero", CMPL, _cmpl(n=0), 400, "n", None),
    ("n-huge", CHAT, _chat(n=1000), 400, "n", None),
    ("presence-penalty", CMPL, _cmpl(presence_penalty=5), 400, "presence_penalty", None),
    ("frequency-penalty", CHAT, _chat(frequency_penalty=-3), 400, "frequency_penalty", None),
    ("repetition-penalty", CMPL, _cmpl(repetition_penalty=0), 400, "repetition_penalty", None),
    ("logprobs-high", CMPL, _cmpl(logprobs=50), 400, "logprobs", None),
    ("top-logprobs-alone", CHAT, _chat(top_logprobs=2), 400, "top_logprobs", None),
    ("logit-bias-key", CMPL, _cmpl(logit_bias={"abc": 1}), 400, "logit_bias", None),
    ("logit-bias-value", CMPL, _cmpl(logit_bias={"5": 500}), 400, "logit_bias", None),
    ("logit-bias-vocab", CHAT, _chat(logit_bias={"99999999": 1}), 400, "logit_bias", None),
    ("stop-five", CMPL, _cmpl(stop=["a", "b", "c", "d", "e"]), 400, "stop", None),
    ("stop-int", CHAT, _chat(stop=7), 400, "stop", None),
    ("stream-str", CMPL, _cmpl(stream="yes"), 400, "stream", None),
    ("seed-huge", CMPL, _cmpl(seed=2**70), 400, "seed", None),
    ("max-tokens-past-int64", CMPL, _cmpl(max_tokens=2**63), 400, "max_tokens", None),
    (
        "max-completion-past-int64",
        CHAT,
        _chat(max_completion_tokens=2**63),
        400,
        "max_completion_tokens",
        None,
    ),
    ("n-past-int64", CHAT, _chat(n=-(2**63) - 1), 400, "n", None),
    ("top-k-past-int64", CMPL, _cmpl(top_k=2**64), 400, "top_k", None),
    ("prompt-id-past-int64", CMPL, _cmpl(prompt=[2**63]), 400, "prompt[0]", None),
    ("detokenize-past-int64", "/detokenize", {"tokens": [2**63]}, 400, "tokens[0]", None),
    (
        "stream-options-no-stream",
        CHAT,
        _chat(stream_options={"include_usage": True}),
        400,
        "stream_options",
        None,
    ),
    (
        "stream-options-stream-false",
        CMPL,
        _cmpl(stream=False, stream_options={}),
        400,
        "stream_options",
        None,
    ),
    ("max-tokens-zero", CMPL, _cmpl(max_tokens=0), 400, "max_tokens", None),
    ("prompt-logprobs-high", CHAT, _chat(prompt_logprobs=21), 400, "prompt_logprobs", None),
    ("messages-missing", CHAT, {"max_tokens": 2}, 400, "messages", None),
    ("messages-empty", CHAT, {"messages": []}, 400, "messages", None),
    (
        "role-bad",
        CHAT,
        {"messages": [{"role": "bot", "content": "x"}]},
        400,
        "messages[0].role",
        None,
    ),
    (
        "content-image",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages[0].content",
        None,
    ),
    (
        "json-schema-missing",
        CHAT,
        _chat(response_format={"type": "json_schema"}),
        400,
        "response_format.json_schema.schema",
        None,
    ),
    (
        "json-schema-unenforceable",
        CHAT,
        _chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}},
            }
        ),
        400,
        "response_format",
        None,
    ),
    ("format-other", CHAT, _chat(response_format={"type": "regex"}), 400, "response_format", None),
    (
        "guided-and-format",
        CMPL,
        _cmpl(guided_json={"type": "object"}, response_format={"type": "json_object"}),
        400,
        "guided_json",
        None,
    ),
    ("guided-lookaround", CMPL, _cmpl(guided_json={"pattern": "(?=x)"}), 400, "guided_json", None),
    ("tools", CHAT, _chat(tools=[{"type": "function"}]), 400, "tools", None),
    ("unknown-model", CHAT, _chat(model="gpt-17"), 404, "model", "model_not_found"),
    (
        "prompt-too-long",
        CMPL,
        _cmpl(prompt="hello " * 400),
        400,
        "prompt",
        "context_length_exceeded",
    ),
    (
        "prompt-too-long-stream",
        CHAT,
        {**_chat(stream=True), "messages": [{"role": "user", "content": "hello " * 400}]},
        400,
        "messages",
        "context_length_exceeded",
    ),
    ("tokenize-neither", "/tokenize", {}, 400, "prompt", None),
    ("detokenize-bad-id", "/detokenize", {"tokens": [-1]}, 400, "tokens", None),
]


def _assert_error_shape(response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert len(response.content) < 1000 and "Traceback" not in response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def _assert_still_serves(http) -> None:
    response = http.post(CHAT, json=GOOD_CHAT)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_request(server: ServerProcess, path, body, status, param, code) -> None:
    with server.http() as http:
        if isinstance(body, bytes):
            response = http.post(path, content=body, headers={"content-type": "application/json"})
        else:
            response = http.post(path, json=body)
        error = _assert_error_shape(response, status)
        assert error["param"] == param
        if code is not None:
            assert error["code"] == code
        if code == "context_length_exceeded":
            assert str(MAX_LEN) in error["message"]
        _assert_still_serves(http)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": f"Basic {KEY}"}, 401),
        ({"Authorization": f"Bearer {KEY}x"}, 401),
        ({"Authorization": f"Bearer {KEY}"}, 200),
    ],
)
def test_auth(server: ServerProcess, headers: dict, status: int) -> None:
    import httpx

    response = httpx.post(server.url + CHAT, json=GOOD_CHAT, headers=headers, timeout=60)
    if status != 200:
        assert _assert_error_shape(response, status)["code"] == "invalid_api_key"
    else:
        assert response.status_code == 200
    assert httpx.get(server.url + "/health").status_code == 200  # health needs no key
    assert httpx.get(server.url + "/metrics").status_code == 401
    cancel = httpx.post(server.url + "/v1/requests/cmpl-x/cancel", headers=headers)
    assert cancel.status_code == (404 if status == 200 else 401)  # cancelling needs the key too


def test_a_body_over_the_limit_is_a_413_declared_or_streamed(server: ServerProcess) -> None:
    big = json.dumps(_chat(stop=["x" * (MAX_BODY + 10)])).encode()

    def chunks():
        for start in range(0, len(big), 4096):
            yield big[start : start + 4096]

    with server.http() as http:
        headers = {"content-type": "application/json"}
        declared = http.post(CHAT, content=big, headers=headers)
        assert _assert_error_shape(declared, 413)["code"] == "request_too_large"
        streamed = http.post(CHAT, content=chunks(), headers=headers)  # chunked, no length
        assert _assert_error_shape(streamed, 413)["code"] == "request_too_large"
        _assert_still_serves(http)


def test_unknown_route_and_method(server: ServerProcess) -> None:
    with server.http() as http:
        assert _assert_error_shape(http.get("/v1/nothing"), 404)["code"] == "not_found"
        assert _assert_error_shape(http.get(CMPL), 405)["code"] == "method_not_allowed"
        _assert_still_serves(http)


@pytest.mark.parametrize(
    "content",
    ["emoji 😀👩‍👩‍👧 ok", "nul \u0000 byte", "rtl שלום", "e\u0301 combining", "\ud83d\ude00"],
    ids=["emoji", "nul", "rtl", "combining", "surrogate-pair"],
)
def test_unicode_prompts_work(server: ServerProcess, content: str) -> None:
    # json.dumps escapes every non-ASCII character, so the server parses \uXXXX escapes
    raw = json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": 3})
    with server.http() as http:
        response = http.post(CHAT, content=raw, headers={"content-type": "application/json"})
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["prompt_tokens"] > 0


def test_official_client_sees_typed_errors(server: ServerProcess) -> None:
    client = server.openai()
    model = client.models.list().data[0].id
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model, prompt="hi", temperature=9)
    assert info.value.status_code == 400
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-17", messages=GOOD_CHAT["messages"])
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0).models.list()
