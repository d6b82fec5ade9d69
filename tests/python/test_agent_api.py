"""The Anthropic Messages and OpenAI Responses APIs end to end, text paths: a real server on the
default model, the official anthropic and openai clients, and the raw frames on the wire."""

from __future__ import annotations

import time

import anthropic
import httpx
import pytest
from agent_clients import GREEDY, wire
from server_harness import ServerProcess

pytestmark = pytest.mark.slow

ASK = "Name three colours."
BILLING = "x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=cli; cch={};"


def test_messages_create_and_stream_agree(claude: anthropic.Anthropic) -> None:
    kwargs = dict(
        model="claude-local-1",
        max_tokens=12,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": ASK}],
    )
    message = claude.messages.create(**kwargs)
    assert message.id.startswith("msg_") and message.model == "claude-local-1"
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.output_tokens <= 12
    with claude.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == message.content[0].text
    assert final.usage.output_tokens == message.usage.output_tokens
    prompt = message.usage.input_tokens + message.usage.cache_read_input_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == prompt
    count = claude.messages.count_tokens(model="claude-local-1", messages=kwargs["messages"])
    assert count.input_tokens == prompt


def test_messages_stop_sequence_is_named(claude: anthropic.Anthropic) -> None:
    kwargs = dict(
        model="m", max_tokens=12, extra_body=GREEDY, messages=[{"role": "user", "content": ASK}]
    )
    text = claude.messages.create(**kwargs).content[0].text
    word = text.split()[1]
    stopped = claude.messages.create(**kwargs, stop_sequences=[word])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", word)
    assert stopped.content[0].text == text[: text.index(word)]


def test_messages_stream_order_on_thewire(agent_proc: ServerProcess) -> None:
    body = {
        "model": "m",
        "max_tokens": 6,
        "temperature": 0,
        "stream": True,
        "messages": [{"role": "user", "content": ASK}],
    }
    events = wire(agent_proc, "/v1/messages?beta=true", body)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == [
        "message_delta",
        "message_stop",
    ]
    assert names[2] == "content_block_start" and names[-3] == "content_block_stop"
    assert set(names[3:-3]) == {"content_block_delta"}
    assert all(name == data["type"] for name, data in events)
    assert events[0][1]["message"]["usage"]["input_tokens"] > 0
    assert events[-2][1]["usage"]["output_tokens"] == 6
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"


def test_claude_code_shaped_request_hits_the_prefix_cache(claude: anthropic.Anthropic) -> None:
    def ask(nonce: str):
        return claude.messages.create(
            model="claude-opus-4-1",
            max_tokens=32000,
            extra_body=GREEDY,
            stop_sequences=["\n"],
            system=[
                {"type": "text", "text": BILLING.format(nonce)},
                {
                    "type": "text",
                    "text": "You are Claude Code, a coding agent.",
                    "cache_control": {"type": "ephemeral"},
                },
                {
                    "type": "text",
                    "text": "Answer in one short line. " * 20,
                    "cache_control": {"type": "ephemeral"},
                },
            ],
            metadata={"user_id": "user_abc_account_def_session_123"},
            tools=[
                {
                    "name": "Read",
                    "description": "Read a file",
                    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
                }
            ],
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Say hi.", "cache_control": {"type": "ephemeral"}}
                    ],
                }
            ],
            extra_headers={
                "anthropic-beta": "claude-code-20250219",
                "anthropic-version": "2023-06-01",
            },
        )

    first, second = ask("36ee5"), ask("0aaa9")
    assert first.content and second.content[0].text == first.content[0].text
    assert second.usage.cache_read_input_tokens > 0
    prompt = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == prompt


def test_messages_errors_in_anthropic_shape(agent_proc: ServerProcess) -> None:
    base = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    cases = [
        ({**base, "max_tokens": 0}, 400, "invalid_request_error"),
        (
            {**base, "messages": [{"role": "user", "content": [image]}]},
            400,
            "invalid_request_error",
        ),
    ]
    with agent_proc.http() as http:
        for body, status, kind in cases:
            response = http.post("/v1/messages", json=body)
            assert response.status_code == status and response.headers["request-id"]
            assert response.json()["type"] == "error" and response.json()["error"]["type"] == kind
        refused = httpx.post(agent_proc.url + "/v1/messages", json=base, timeout=10)
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"
        assert "no vision" in http.post("/v1/messages", json=cases[1][0]).json()["error"]["message"]


def test_responses_create_store_and_continue(oai) -> None:
    first = oai.responses.create(model="gpt-5", input=ASK, max_output_tokens=8, temperature=0)
    assert first.id.startswith("resp_") and first.object == "response" and first.model == "gpt-5"
    assert first.status in ("completed", "incomplete") and first.output_text
    assert first.output[0].id.startswith("msg_")
    assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
    assert oai.responses.retrieve(first.id).output_text == first.output_text
    follow = oai.responses.create(
        model="gpt-5",
        input="And one more.",
        max_output_tokens=4,
        previous_response_id=first.id,
        temperature=0,
    )
    assert follow.usage.input_tokens > first.usage.input_tokens
    assert follow.usage.input_tokens_details.cached_tokens > 0
    oai.responses.delete(first.id)
    with pytest.raises(Exception) as e:
        oai.responses.retrieve(first.id)
    assert getattr(e.value, "status_code", None) == 404


def test_responses_stream_events(agent_proc: ServerProcess, oai) -> None:
    body = {"model": "m", "input": ASK, "max_output_tokens": 6, "temperature": 0, "stream": True}
    events = [data for _, data in wire(agent_proc, "/v1/responses", body)]
    numbers = [e["sequence_number"] for e in events]
    assert numbers == sorted(set(numbers))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in (
        "response.completed",
        "response.incomplete",
    )
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds
    # The SDK's typed events; its stream helper wants response.completed, which a cut answer
    # (response.incomplete, as OpenAI sends it too) is not.
    typed = list(
        oai.responses.create(model="m", input=ASK, max_output_tokens=6, temperature=0, stream=True)
    )
    assert [e.type for e in typed] == kinds
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert typed[-1].response.output_text == text


def test_responses_prompt_over_the_context_fails_in_the_stream(agent_proc: ServerProcess) -> None:
    body = {"model": "m", "input": "word " * 1500, "stream": True}
    events = [data for _, data in wire(agent_proc, "/v1/responses", body)]
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "context_length_exceeded"


def test_codex_shaped_request_repeats_from_the_cache(oai) -> None:
    def ask():
        return oai.responses.create(
            model="gpt-5-codex",
            instructions="You are Codex, a coding agent. " * 10,
            input=[
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Say hi."}],
                }
            ],
            tools=[
                {
                    "type": "function",
                    "name": "shell",
                    "description": "Run a command",
                    "parameters": {
                        "type": "object",
                        "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                        "required": ["command"],
                    },
                    "strict": False,
                },
                {
                    "type": "custom",
                    "name": "apply_patch",
                    "description": "Apply a patch",
                    "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
                },
                {"type": "web_search"},
            ],
            tool_choice="auto",
            parallel_tool_calls=False,
            reasoning={"effort": "medium", "summary": "auto"},
            store=False,
            stream=False,
            include=["reasoning.encrypted_content"],
            prompt_cache_key="session-1",
            max_output_tokens=8,
            temperature=0,
        )

    first, second = ask(), ask()
    assert first.output and second.output_text == first.output_text
    assert second.usage.input_tokens_details.cached_tokens > 0
    with pytest.raises(Exception) as e:
        oai.responses.retrieve(first.id)  # store: false kept nothing
    assert getattr(e.value, "status_code", None) == 404


def test_responses_bad_input_is_a_400_naming_it(agent_proc: ServerProcess) -> None:
    with agent_proc.http() as http:
        response = http.post(
            "/v1/responses", json={"input": [{"type": "item_reference", "id": "x"}]}
        )
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "input[0].type"
        response = http.post(
            "/v1/responses", json={"input": "x", "previous_response_id": "resp_no"}
        )
        assert (
            response.status_code == 404
            and response.json()["error"]["param"] == "previous_response_id"
        )


def test_same_greedy_text_through_chat_messages_and_responses(claude, oai) -> None:
    chat = oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": ASK}], max_tokens=10, temperature=0
    )
    message = claude.messages.create(
        model="m", max_tokens=10, extra_body=GREEDY, messages=[{"role": "user", "content": ASK}]
    )
    response = oai.responses.create(model="m", input=ASK, max_output_tokens=10, temperature=0)
    assert chat.choices[0].message.content == message.content[0].text == response.output_text


def _leave_early(agent_proc: ServerProcess, path: str, body: dict) -> None:
    with agent_proc.http(timeout=60) as http, http.stream("POST", path, json=body) as response:
        for line in response.iter_lines():
            if "_delta" in line or "output_text.delta" in line:
                break


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/messages",
            {"max_tokens": 400, "messages": [{"role": "user", "content": "Tell a long story."}]},
        ),
        ("/v1/responses", {"input": "Tell a long story.", "max_output_tokens": 400}),
    ],
)
def test_disconnect_mid_stream_frees_the_sequence(
    agent_proc: ServerProcess, path: str, body: dict
) -> None:
    _leave_early(agent_proc, path, {**body, "model": "m", "stream": True, "temperature": 0})
    deadline = time.monotonic() + 5.0
    with agent_proc.http() as http:
        while True:
            stats = http.get("/status").json()["stats"]
            if stats["kv_blocks_used"] == stats["running"] == stats["waiting"] == 0:
                break
            assert time.monotonic() < deadline, f"still busy after the client left: {stats}"
            time.sleep(0.1)
