"""Pure tests of the chat pipeline's pieces: which format a template calls for, the settings
that choose formats and names, model names with '*', the generic format's rendering."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from met.chat.render import generic_system_text, template_messages, with_system_text
from met.chat.setup import detect_tool_format, resolve_setup
from met.chat.types import ChatMessage, ToolCall, ToolSpec
from met.server.errors import APIError
from met.server.settings import SettingsError, load_settings
from met.server.state import ServerState


@pytest.mark.parametrize(
    ("template", "fmt"),
    [
        (None, None),
        ("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}", None),
        ("{% if tools %}<tool_call>{{ tools }}</tool_call>{% endif %}", "hermes"),
        ("{% if tools %}<tool_call><function={{ t }}>{% endif %}", "qwen3_coder"),
        ("{% if tools %}[TOOL_CALLS]{% endif %}", "mistral"),
        ("{% if tools %}<|python_tag|>{% endif %}", "llama3_json"),
        ("{% if tools %}[func_name1(params_name1=params_value1)]{% endif %}", "pythonic"),
    ],
)
def test_the_format_comes_from_the_template(template: str | None, fmt: str | None) -> None:
    assert detect_tool_format(template) == fmt


def test_flags_override_the_template() -> None:
    hermes = "{% if tools %}<tool_call>{% endif %}<think>"
    assert resolve_setup(hermes, None, None).describe() == {
        "tool_call_format": "hermes",
        "tool_call_format_source": "template",
        "reasoning_parser": "qwen3",
    }
    flagged = resolve_setup(hermes, "generic", "none")
    assert (flagged.tool_format, flagged.tool_source, flagged.reasoning) == (
        "generic",
        "flag",
        None,
    )
    assert not flagged.template_tools
    plain = resolve_setup("{{ messages }}", "auto", "auto")
    assert (plain.tool_format, plain.tool_source) == ("generic", "no tool support in the template")


def test_settings_of_the_chat_pipeline(tmp_path) -> None:
    s = load_settings(["--served-model-name", "a", "*", "--tool-call-parser", "hermes"], env={})
    assert s.served_model_name == ["a", "*"] and s.tool_call_parser == "hermes"
    env = {"MET_SERVED_MODEL_NAME": "x, y", "MET_MAX_THINKING_TOKENS": "64"}
    s = load_settings([], env=env)
    assert s.served_model_name == ["x", "y"] and s.max_thinking_tokens == 64
    config = tmp_path / "met.toml"
    config.write_text('served-model-name = ["p", "q"]\nreasoning-parser = "none"\n')
    s = load_settings(["--config", str(config)], env={})
    assert s.served_model_name == ["p", "q"] and s.reasoning_parser == "none"
    with pytest.raises(SystemExit):
        load_settings(["--tool-call-parser", "json"], env={})
    with pytest.raises(SettingsError):
        load_settings([], env={"MET_MAX_THINKING_TOKENS": "-1"})


def _state(names: list[str] | None) -> ServerState:
    settings = load_settings([], env={})
    settings.served_model_name = names
    return ServerState(SimpleNamespace(model_name="SmolLM2", ready=True), settings)


def _answer(state: ServerState, requested: str | None) -> str:
    """The name a response carries for a request naming `requested` (the router's pick)."""
    return state.router.find(requested).answer_name(requested)


def test_model_names_and_the_wildcard() -> None:
    plain = _state(None)
    assert _answer(plain, "SmolLM2") == "SmolLM2" and _answer(plain, None) == "SmolLM2"
    with pytest.raises(APIError) as e:
        _answer(plain, "gpt-4o")
    assert e.value.status == 404
    several = _state(["met", "alias"])
    assert _answer(several, "alias") == "alias" and _answer(several, None) == "met"
    assert _answer(several, "SmolLM2") == "met"
    anything = _state(["met", "*"])
    assert _answer(anything, "gpt-4o") == "gpt-4o" and anything.served_model_name == "met"
    assert _state(["*"]).served_model_name == "SmolLM2"


def test_the_generic_format_writes_calls_and_results_as_json() -> None:
    call = ToolCall("call_123456789", "get_weather", '{"city": "Paris"}')
    messages = [
        ChatMessage("user", "Weather?"),
        ChatMessage("assistant", "", tool_calls=[call]),
        ChatMessage("tool", "sunny", tool_call_id=call.id, name="get_weather"),
    ]
    out = template_messages(messages, generic=True)
    assert json.loads(out[1]["content"]) == {
        "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": call.id}]
    }
    assert out[2]["role"] == "user"
    assert json.loads(out[2]["content"])["tool_response"]["content"] == "sunny"
    native = template_messages(messages, generic=False)
    assert native[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    tools = [ToolSpec("get_weather", "Weather", {"type": "object"})]
    forced, free = generic_system_text(tools, True), generic_system_text(tools, False)
    assert '"get_weather"' in forced and "response" not in forced and "response" in free
    merged = with_system_text([{"role": "system", "content": "Be brief."}], "TOOLS")
    assert merged == [{"role": "system", "content": "TOOLS\n\nBe brief."}]


def test_history_arguments_that_are_not_json_name_the_message() -> None:
    bad = [
        ChatMessage("user", "x"),
        ChatMessage("assistant", tool_calls=[ToolCall("c" * 9, "f", "{")]),
    ]
    with pytest.raises(APIError) as e:
        template_messages(bad, generic=False)
    assert e.value.param == "messages[1].tool_calls[0].function.arguments"
    assert "message 1" in e.value.message
