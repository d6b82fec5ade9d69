"""Bodies that Anthropic's and OpenAI's APIs refuse are refused here too, through the anthropic
and openai clients against a real server: a 400 in the API's own shape naming the field, sent
before anything is queued (no prompt tokens admitted), and the server serves on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anthropic
import openai
import pytest
from agent_clients import GREEDY
from server_harness import ServerProcess

pytestmark = pytest.mark.slow

BIG = 2**63
ASK = [{"role": "user", "content": "Weather in Oslo?"}]
CALL = {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Oslo"}}
TOOLS = [{"name": "get_weather", "input_schema": {"type": "object"}}]
FUNCTION_CALL = {
    "type": "function_call",
    "call_id": "call_01",
    "name": "get_weather",
    "arguments": '{"city": "Oslo"}',
}


@contextmanager
def _nothing_admitted(server: ServerProcess) -> Iterator[None]:
    with server.http() as http:
        before = http.get("/status").json()["stats"]["prompt_tokens_total"]
        yield
        assert http.get("/status").json()["stats"]["prompt_tokens_total"] == before


def _anthropic_400(server: ServerProcess, send: Callable[[], object]) -> str:
    """The message of the Anthropic-shaped 400 that `send` gets, nothing admitted for it."""
    with _nothing_admitted(server), pytest.raises(anthropic.BadRequestError) as e:
        send()
    assert e.value.status_code == 400 and e.value.response.headers["request-id"]
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    return e.value.body["error"]["message"]


def _openai_400(server: ServerProcess, send: Callable[[], object], param: str) -> str:
    with _nothing_admitted(server), pytest.raises(openai.BadRequestError) as e:
        send()
    assert e.value.status_code == 400 and e.value.type == "invalid_request_error"
    assert e.value.param == param
    return e.value.body["message"]


def _serves_on(claude: anthropic.Anthropic, oai: openai.OpenAI) -> None:
    message = claude.messages.create(model="m", max_tokens=4, extra_body=GREEDY, messages=ASK)
    assert message.usage.output_tokens > 0
    assert oai.responses.create(model="m", input="Hi.", max_output_tokens=4).output_text


def test_messages_tool_result_for_no_tool_use(agent_proc, claude, oai) -> None:
    messages = [
        *ASK,
        {"role": "assistant", "content": [CALL]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_99", "content": "Sunny"}],
        },
    ]
    kwargs = dict(model="m", max_tokens=8, tools=TOOLS, messages=messages)
    said = _anthropic_400(agent_proc, lambda: claude.messages.create(**kwargs))
    assert said.startswith("messages[2].content[0].tool_use_id: 'toolu_99'")

    def stream() -> None:
        with claude.messages.stream(**kwargs) as events:
            events.get_final_message()

    assert _anthropic_400(agent_proc, stream) == said
    count = _anthropic_400(
        agent_proc, lambda: claude.messages.count_tokens(model="m", tools=TOOLS, messages=messages)
    )
    assert count == said
    _serves_on(claude, oai)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("", "messages[1]: all messages must have non-empty content except for the optional final"),
        ([], "messages[1]: all messages must have non-empty content except for the optional final"),
        ([{"type": "text", "text": ""}], "messages[1].content[0]: text content blocks must be"),
    ],
)
def test_messages_empty_content(agent_proc, claude, oai, content, said) -> None:
    # A final assistant message may be empty (a prefill of nothing); no other message may.
    messages = [*ASK, {"role": "assistant", "content": content}, *ASK]
    got = _anthropic_400(
        agent_proc, lambda: claude.messages.create(model="m", max_tokens=4, messages=messages)
    )
    assert got.startswith(said)
    if isinstance(content, str) or not content:
        prefill = [*ASK, {"role": "assistant", "content": content}]
        assert claude.messages.create(model="m", max_tokens=4, extra_body=GREEDY, messages=prefill)
    _serves_on(claude, oai)


def test_messages_max_tokens_past_int64(agent_proc, claude, oai) -> None:
    said = _anthropic_400(
        agent_proc, lambda: claude.messages.create(model="m", max_tokens=BIG, messages=ASK)
    )
    assert said == "max_tokens: must fit in a signed 64-bit integer"
    _serves_on(claude, oai)


def test_messages_thinking_budget_over_max_tokens(agent_proc, claude, oai) -> None:
    said = _anthropic_400(
        agent_proc,
        lambda: claude.messages.create(
            model="m",
            max_tokens=16,
            thinking={"type": "enabled", "budget_tokens": 4096},
            messages=ASK,
        ),
    )
    assert said == "max_tokens: must be greater than thinking.budget_tokens (4096)"
    _serves_on(claude, oai)


def test_responses_max_output_tokens_past_int64(agent_proc, claude, oai) -> None:
    said = _openai_400(
        agent_proc,
        lambda: oai.responses.create(model="m", input="Hi.", max_output_tokens=BIG),
        "max_output_tokens",
    )
    assert said == "max_output_tokens: must fit in a signed 64-bit integer"
    _serves_on(claude, oai)


def test_responses_function_call_output_for_no_call(agent_proc, claude, oai) -> None:
    output = {"type": "function_call_output", "call_id": "call_99", "output": "Sunny"}
    said = _openai_400(
        agent_proc,
        lambda: oai.responses.create(model="m", input=[*ASK, FUNCTION_CALL, output]),
        "input[2].call_id",
    )
    assert "No tool call found" in said and "'call_99'" in said
    _openai_400(
        agent_proc,
        lambda: list(oai.responses.create(model="m", input=[*ASK, output], stream=True)),
        "input[1].call_id",
    )
    # The previous response's calls count; one it did not make still does not.
    first = oai.responses.create(model="m", input=ASK, max_output_tokens=2, temperature=0)
    _openai_400(
        agent_proc,
        lambda: oai.responses.create(model="m", input=[output], previous_response_id=first.id),
        "input[0].call_id",
    )
    _serves_on(claude, oai)


# Integer fields past int64 on each route, each through its client: the same 400 everywhere.
PAST_INT64 = {
    "chat": (
        lambda c, o: o.chat.completions.create(model="m", messages=ASK, max_completion_tokens=BIG),
        "max_completion_tokens",
    ),
    "completions": (
        lambda c, o: o.completions.create(model="m", prompt="Hi", max_tokens=2, seed=BIG),
        "seed",
    ),
    "messages-top-k": (
        lambda c, o: c.messages.create(
            model="m", max_tokens=4, extra_body={"top_k": BIG}, messages=ASK
        ),
        "top_k",
    ),
    "count-tokens": (
        lambda c, o: c.messages.count_tokens(
            model="m", thinking={"type": "enabled", "budget_tokens": BIG}, messages=ASK
        ),
        "thinking.budget_tokens",
    ),
    "responses": (
        lambda c, o: o.responses.create(model="m", input="Hi.", max_output_tokens=BIG),
        "max_output_tokens",
    ),
}


@pytest.mark.parametrize("route", PAST_INT64)
def test_every_route_refuses_an_integer_past_int64(agent_proc, claude, oai, route: str) -> None:
    send, param = PAST_INT64[route]
    if route in ("messages-top-k", "count-tokens"):
        said = _anthropic_400(agent_proc, lambda: send(claude, oai))
    else:
        said = _openai_400(agent_proc, lambda: send(claude, oai), param)
    assert said == f"{param}: must fit in a signed 64-bit integer"
