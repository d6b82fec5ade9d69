"""The OpenAI-compatible API end to end: a real server, the official client, the default model."""

from __future__ import annotations

import json

import pytest
from constraint_support import assert_json_answer
from server_harness import ServerProcess, start_server

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def server():
    proc = start_server("--max-model-len", "512")
    yield proc
    assert proc.stop() == 0


@pytest.fixture(scope="module")
def client(server: ServerProcess):
    return server.openai()


def test_models_with_and_without_prefix(server: ServerProcess) -> None:
    with server.http() as http:
        for path in ("/v1/models", "/models"):
            body = http.get(path).json()
            assert body["object"] == "list" and body["data"][0]["object"] == "model"
        assert http.get("/health").json() == {"status": "ok"}
        assert "version" in http.get("/version").json()


def test_completion_text_and_usage(client) -> None:
    out = client.completions.create(
        model=_model(client), prompt=PROMPT, max_tokens=8, temperature=0
    )
    choice = out.choices[0]
    assert out.object == "text_completion" and choice.finish_reason in ("length", "stop")
    assert out.usage.prompt_tokens > 0 and out.usage.completion_tokens <= 8
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert out.usage.prompt_tokens_details.cached_tokens >= 0


def test_prompt_forms_agree(server: ServerProcess, client) -> None:
    ids = server.http().post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    texts = {
        client.completions.create(model=_model(client), prompt=p, max_tokens=6, temperature=0)
        .choices[0]
        .text
        for p in (PROMPT, [PROMPT], ids)
    }
    assert len(texts) == 1


def test_echo_prefixes_the_prompt(client) -> None:
    out = client.completions.create(
        model=_model(client), prompt=PROMPT, max_tokens=4, temperature=0, echo=True
    )
    assert out.choices[0].text.startswith(PROMPT) and len(out.choices[0].text) > len(PROMPT)


def test_completion_logprobs(client) -> None:
    out = client.completions.create(
        model=_model(client), prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2
    )
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(v <= 0 for v in lp.token_logprobs)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    # greedy: the chosen token is the most likely one
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert max(top.values()) == pytest.approx(value, abs=1e-3) and token in top


def test_chat_completion(client) -> None:
    out = client.chat.completions.create(
        model=_model(client), messages=CHAT, max_tokens=12, temperature=0
    )
    message = out.choices[0].message
    assert out.object == "chat.completion" and message.role == "assistant" and message.content
    assert out.usage.completion_tokens <= 12


def test_chat_json_mode(client) -> None:
    out = client.chat.completions.create(
        model=_model(client),
        messages=[{"role": "user", "content": "Describe a cat with its name, age and colour."}],
        max_tokens=200,
        temperature=0,
        response_format={"type": "json_object"},
    )
    choice = out.choices[0]
    assert_json_answer(choice.message.content, choice.finish_reason)


def test_chat_json_schema(client) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "legs": {"type": "integer"}},
        "required": ["name", "legs"],
        "additionalProperties": False,
    }
    out = client.chat.completions.create(
        model=_model(client),
        messages=[{"role": "user", "content": "Describe a cat."}],
        max_tokens=100,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}},
    )
    choice = out.choices[0]
    assert_json_answer(choice.message.content, choice.finish_reason)
    if choice.finish_reason == "stop":
        cat = json.loads(choice.message.content)
        assert set(cat) == {"name", "legs"} and isinstance(cat["legs"], int)


def test_completion_with_a_schema_and_vllms_guided_json(client) -> None:
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Lyon"]}}}
    schema["required"] = ["city"]
    texts = []
    for extra in (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}},
        {"guided_json": schema},
    ):
        out = client.completions.create(
            model=_model(client),
            prompt="The capital of France, as JSON:",
            max_tokens=60,
            temperature=0,
            extra_body=extra,
        )
        choice = out.choices[0]
        assert_json_answer(choice.text, choice.finish_reason)
        # One required key from an enum, nothing else allowed: the object must close.
        assert choice.finish_reason == "stop"
        assert json.loads(choice.text)["city"] in ("Paris", "Lyon")
        texts.append(choice.text)
    assert texts[0] == texts[1]


def test_chat_logprobs(client) -> None:
    out = client.chat.completions.create(
        model=_model(client),
        messages=CHAT,
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert all(len(item.top_logprobs) == 3 and item.logprob <= 0 for item in content)
    if out.choices[0].finish_reason == "length":  # no end-of-turn token among them
        assert "".join(item.token for item in content) == out.choices[0].message.content


def test_max_completion_tokens(client) -> None:
    out = client.chat.completions.create(
        model=_model(client), messages=CHAT, max_completion_tokens=3, temperature=0
    )
    assert out.usage.completion_tokens == 3 and out.choices[0].finish_reason == "length"


def test_n_choices(client) -> None:
    out = client.chat.completions.create(
        model=_model(client), messages=CHAT, max_tokens=6, temperature=1.0, n=2, seed=7
    )
    assert [c.index for c in out.choices] == [0, 1]
    greedy = client.completions.create(
        model=_model(client), prompt=PROMPT, max_tokens=6, temperature=0, n=2
    )
    assert greedy.choices[0].text == greedy.choices[1].text
    assert greedy.usage.completion_tokens == 12


def test_stream_equals_non_stream_chat(client) -> None:
    args = dict(model=_model(client), messages=CHAT, max_tokens=16, temperature=0)
    whole = client.chat.completions.create(**args).choices[0].message.content
    chunks = list(
        client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("length", "stop") and set(finishes[:-1]) == {None}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole


def test_stream_equals_non_stream_completion(client) -> None:
    args = dict(model=_model(client), prompt=PROMPT, max_tokens=16, temperature=0)
    whole = client.completions.create(**args).choices[0].text
    text = "".join(c.choices[0].text for c in client.completions.create(**args, stream=True))
    assert text == whole


def test_raw_sse_framing(server: ServerProcess) -> None:
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True}
    with server.http().stream("POST", "/v1/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)
    assert all("choices" in json.loads(line[6:]) for line in lines[:-1])


def test_stop_string_split_across_tokens(client) -> None:
    args = dict(model=_model(client), prompt=PROMPT, max_tokens=24, temperature=0)
    # Without stop strings each streamed chunk is one token's text.
    pieces = [c.choices[0].text for c in client.completions.create(**args, stream=True)]
    text = "".join(pieces)
    k = next(i for i in range(len(pieces) - 1) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2)
    cut = len("".join(pieces[: k + 1]))
    stop = text[cut - 2 : cut + 2]  # straddles the boundary between tokens k and k + 1
    expected = text[: text.find(stop)]
    out = client.completions.create(**args, stop=[stop, "\u2603 never"])
    assert out.choices[0].text == expected and out.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(**args, stop=stop, stream=True))
    streamed = "".join(c.choices[0].text for c in chunks)
    assert streamed == expected and stop not in streamed
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stop_string_chat_stream(client) -> None:
    args = dict(model=_model(client), messages=CHAT, max_tokens=16, temperature=0)
    whole = client.chat.completions.create(**args).choices[0].message.content
    stop = whole[3:6]
    expected = whole[: whole.find(stop)]
    chunks = list(client.chat.completions.create(**args, stop=stop, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected and chunks[-1].choices[0].finish_reason == "stop"


def test_sampling_parameters_accepted(client) -> None:
    request = {
        "model": _model(client),
        "prompt": PROMPT,
        "max_tokens": 8,
        "temperature": 0.8,
        "top_p": 0.9,
        "seed": 3,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "logit_bias": {"13": -100},
        "user": "tester",
        "extra_body": {"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1},
    }
    out = client.completions.create(**request)
    again = client.completions.create(**request)
    assert out.choices[0].text == again.choices[0].text  # same seed, same text


def test_max_tokens_clamped_to_context(server: ServerProcess, client) -> None:
    token = server.http().post("/tokenize", json={"prompt": " hello"}).json()["tokens"][0]
    prompt = [token] * (512 - 5)  # leaves room for five tokens
    out = client.completions.create(
        model=_model(client),
        prompt=prompt,
        max_tokens=400,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert out.usage.completion_tokens == 5 and out.choices[0].finish_reason == "length"


def test_tokenize_detokenize(server: ServerProcess) -> None:
    with server.http() as http:
        tokens = http.post("/tokenize", json={"prompt": "héllo 😀"}).json()
        assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 512
        back = http.post("/detokenize", json={"tokens": tokens["tokens"]}).json()
        assert back["prompt"].endswith("héllo 😀")
        chat = http.post("/tokenize", json={"messages": CHAT}).json()
        assert chat["count"] > tokens["count"]


def test_metrics_and_status(server: ServerProcess) -> None:
    with server.http() as http:
        http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2})
        response = http.get("/metrics")
        text = response.text
        openmetrics = http.get("/metrics", headers={"Accept": "application/openmetrics-text"})
        status = http.get("/status").json()
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert openmetrics.text.endswith("# EOF\n") and "met_requests_total{" in openmetrics.text
    assert 'met_generation_tokens_total{api="chat"}' in text
    assert 'met_generation_tokens_total{api="completions"}' in text
    assert 'met_requests_total{api="chat",code="200",finish=' in text
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"):
        assert name in text
    assert "python_info{" in text and "python_gc_objects_collected_total" in text
    for name in (
        "met_requests_total{",
        "met_time_to_first_token_seconds_bucket",
        "met_inter_token_latency_seconds_count",
        "met_e2e_request_latency_seconds_sum",
        "met_num_requests_running",
        "met_num_requests_waiting",
        "met_kv_blocks_used",
        "met_kv_blocks_total",
        "met_prefix_cache_hit_rate",
        "met_generation_tokens_total",
        "met_prompt_tokens_total",
    ):
        assert name in text
    assert status["ready"] is True and status["model"] and status["info"]["kv_blocks_total"] > 0
    assert status["stats"]["requests_total"] > 0 and status["stats"]["generated_tokens_total"] > 0
    assert status["requests"] and {"id", "state", "tokens_per_s", "age_s"} <= set(
        status["requests"][0]
    )
    assert any("status=200" in line for line in status["recent_logs"])


def _model(client) -> str:
    return client.models.list().data[0].id
