"""The forced-call grammars of every format, walked by llguidance over a tiny tokenizer with a
random pick among the allowed tokens: whatever is picked, the output parses back into calls
whose arguments validate, and the thinking budget ends the think block."""

from __future__ import annotations

import json
import random

import jsonschema
import llguidance as llg
import numpy as np
import pytest
from chat_model import write_qwen3_style_model

from met.chat.constrain import Plan, Thinking
from met.chat.parsers import TOOL_PARSERS, ChoiceParser
from met.chat.parsers.reasoning import ReasoningSplitter
from met.chat.types import ChatResult, ToolSpec
from met.constraints import ModelGrammar, check
from met.sampling import Constraint
from met.tokenizer import Tokenizer

WEATHER = ToolSpec(
    "get_weather",
    None,
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 6},
            "days": {"type": "integer", "minimum": 1, "maximum": 9},
            "metric": {"type": "boolean"},
        },
        "required": ["city", "days"],
    },
)
CLOCK = ToolSpec("get_time", None, {"type": "object", "properties": {}})
SCHEMAS = {t.name: t.parameters for t in (WEATHER, CLOCK)}
FORMATS = ["hermes", "qwen3_coder", "llama3_json", "mistral", "pythonic", "gemma4", "generic"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, llg.LLTokenizer]:
    tokenizer = Tokenizer.from_hf_folder(write_qwen3_style_model(tmp_path_factory.mktemp("m")))
    return tokenizer, ModelGrammar(tokenizer, tokenizer.vocab_size).tokenizer


def walk(model, grammar: str, seed: int, steps: int = 2000, start: list[int] | None = None) -> str:
    """Random allowed tokens (printable ASCII preferred, so strings stay short) until the
    grammar is complete and the pick is to stop, after the tokens `start`."""
    tokenizer, llt = model
    matcher = llg.LLMatcher(llt, check(Constraint("lark", grammar, param="tools"), llt))
    rnd, out = random.Random(seed), list(start or [])
    for token in out:
        assert matcher.consume_token(token), matcher.get_error()
    for _ in range(steps):
        allowed = np.nonzero(np.frombuffer(matcher.compute_logit_bias(), dtype=np.uint8))[0]
        stop = [int(t) for t in allowed if t in tokenizer.eos_token_ids]
        if matcher.is_stopped() or (stop and rnd.random() < 0.5):
            break
        plain = [int(t) for t in allowed if t not in stop and tokenizer.token_bytes(t).isascii()]
        token = rnd.choice(plain or [int(t) for t in allowed if t not in stop])
        assert matcher.consume_token(token), matcher.get_error()
        out.append(token)
    assert matcher.is_accepting()
    return tokenizer.decode(out)


def parse(fmt: str, text: str, thinking: bool) -> ChatResult:
    parser = ChoiceParser(
        TOOL_PARSERS[fmt]([WEATHER, CLOCK]), ReasoningSplitter() if thinking else None
    )
    result = ChatResult()
    for event in parser.feed(text) + parser.finish():
        result.add(event)
    return result


def specials(model) -> dict[str, int]:
    tokenizer, _ = model
    return {
        m: tokenizer.encode(m)[0] for m in ("<think>", "</think>", "<tool_call>", "</tool_call>")
    }


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("fmt", FORMATS)
def test_forced_calls_parse_and_validate(model, fmt: str, parallel: bool) -> None:
    plan = Plan(
        fmt,
        [WEATHER, CLOCK],
        forced=True,
        parallel=parallel,
        thinking=None,
        specials=specials(model),
    )
    for seed in range(4):
        text = walk(model, plan.grammar(), seed)
        result = parse(fmt, text, thinking=False)
        assert result.content == "", text
        assert result.tool_calls and (parallel or len(result.tool_calls) == 1)
        for call in result.tool_calls:
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def test_a_named_tool_is_the_only_one(model) -> None:
    plan = Plan("hermes", [CLOCK], forced=True, parallel=False, thinking=None)
    for seed in range(3):
        calls = parse("hermes", walk(model, plan.grammar(), seed), False).tool_calls
        assert [(c.name, c.arguments) for c in calls] == [("get_time", "{}")]


@pytest.mark.parametrize("opened", [False, True])
def test_the_thinking_budget_forces_the_end_marker(model, opened: bool) -> None:
    plan = Plan(
        "hermes",
        [WEATHER],
        forced=True,
        parallel=False,
        thinking=Thinking(opened, budget=5),
        specials=specials(model),
    )
    tokenizer, _ = model
    for seed in range(3):
        text = walk(model, plan.grammar(), seed)
        think, _, rest = text.partition("</think>")
        assert rest, text
        assert len(tokenizer.encode(think.removeprefix("<think>"))) <= 5
        result = parse("hermes", text, thinking=True) if not opened else None
        if result is not None:
            assert result.reasoning is not None and len(result.tool_calls) == 1


def test_a_think_block_without_a_budget_ends_at_its_marker_token(model) -> None:
    # The end marker is one token of the model: the text before it is a lexeme that cannot hold
    # it, and with no budget nothing caps it (a forced call on Qwen3.5 with thinking on).
    plan = Plan(
        "qwen3_coder",
        [WEATHER],
        forced=True,
        parallel=False,
        thinking=Thinking(False, budget=None),
        specials=specials(model),
    )
    marks = specials(model)
    tokenizer, _ = model
    thought = [marks["<think>"], *tokenizer.encode("hm"), marks["</think>"]]
    for seed in range(3):
        text = walk(model, plan.grammar(), seed, start=thought)
        result = parse("qwen3_coder", text, thinking=True)
        assert result.reasoning == "hm" and len(result.tool_calls) == 1, text


def test_a_budget_without_tools_leaves_the_answer_free(model) -> None:
    plan = Plan(
        "none",
        [],
        forced=False,
        parallel=True,
        thinking=Thinking(False, 3),
        specials=specials(model),
    )
    grammar = plan.grammar()
    assert grammar is not None and "max_tokens=3" in grammar
    assert (
        Plan("none", [], forced=False, parallel=True, thinking=Thinking(False, None)).grammar()
        is None
    )
