"""prepare(): one chat request, validated once, rendered by the model's template, constrained
where it must be; ChatRun: its n choices as typed events (streamed) or ChatResults (whole)."""

from __future__ import annotations

import copy
import functools
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from met.chat.constrain import EFFORT_BUDGETS, Plan, Thinking
from met.chat.harmony import HarmonyParser
from met.chat.parsers import TOOL_PARSERS, ChoiceParser
from met.chat.parsers.base import NoTools
from met.chat.parsers.gemma4 import CALL_CLOSE, CALL_OPEN, QUOTE
from met.chat.parsers.hermes import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from met.chat.parsers.jsonish import ARGS, PYTHON_TAG, TOOL_CALLS
from met.chat.parsers.pythonic import PYTHON_END, PYTHON_START
from met.chat.parsers.reasoning import (
    CHANNEL,
    CHANNEL_CLOSE,
    REASONING_TAGS,
    THINK_CLOSE,
    THINK_OPEN,
    ReasoningSplitter,
)
from met.chat.render import generic_system_text, template_messages, tool_dicts, with_system_text
from met.chat.setup import HARMONY, ChatSetup
from met.chat.types import ChatEvent, ChatRequest, ChatResult, Finish, Logprobs, ToolSpec, Usage
from met.constraints.state import common_prefix
from met.engine.outputs import CompletionDelta, TokenLogprob
from met.sampling import Constraint, SamplingParams
from met.server.errors import invalid
from met.server.generation import Generation, fit_max_tokens, public_finish_reason
from met.server.served_model import ServedModel

log = logging.getLogger("met.chat")

# What the output parsers look for; the ones a model has as control tokens must stay in the text.
MARKERS = (THINK_OPEN, THINK_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_CALLS, ARGS, PYTHON_TAG)
MARKERS += (PYTHON_START, PYTHON_END, CALL_OPEN, CALL_CLOSE, QUOTE, CHANNEL, CHANNEL_CLOSE)
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


@dataclass
class PreparedChat:
    request: ChatRequest
    prompt_ids: list[int]
    params: SamplingParams
    setup: ChatSetup
    tool_format: str  # the parser this request's output goes through ("none": plain text)
    starts_thinking: bool  # the prompt ends inside an open think block
    max_calls: int | None
    forced: bool = False  # the grammar forces calls (tool_choice required or a named function)

    def parser(self) -> ChoiceParser | HarmonyParser:
        if self.setup.tool_format == HARMONY:
            return HarmonyParser(self.max_calls)
        parser = TOOL_PARSERS.get(self.tool_format, NoTools)
        tools = parser(self.request.tools, self.max_calls, forced=self.forced)
        reasoning = None
        if self.setup.reasoning is not None:
            tags = REASONING_TAGS[self.setup.reasoning]
            reasoning = ReasoningSplitter(self.starts_thinking, *tags)
        return ChoiceParser(tools, reasoning)


def prepare(state: ServedModel, request: ChatRequest) -> PreparedChat:
    """Validate, render and constrain; raises APIError (400) naming the offending field."""
    engine = state.engine
    if not request.messages:
        raise invalid("messages: must not be empty", param="messages")
    _check_tools(request)
    setup = state.chat_setup
    calls_on = bool(request.tools) and request.tool_choice != "none"
    if setup.tool_format == HARMONY:
        return _prepare_harmony(state, request, calls_on)
    generic = setup.tool_format == "generic" or not setup.template_tools
    messages = template_messages(request.messages, generic=generic)
    kwargs = dict(request.template_kwargs)
    if calls_on and not generic:
        kwargs["tools"] = tool_dicts(request.tools)
    elif calls_on:
        forced = request.tool_choice != "auto"
        messages = with_system_text(messages, generic_system_text(request.tools, forced))
    enable_thinking = request.enable_thinking
    if enable_thinking is None and request.reasoning_effort == "none":
        enable_thinking = False
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    if request.reasoning_effort is not None:
        kwargs["reasoning_effort"] = request.reasoning_effort
    prompt_ids = render(engine, messages, kwargs)
    params = copy.deepcopy(request.params)
    params.history_end = _history_end(engine, messages, kwargs, prompt_ids)
    params.max_tokens = fit_max_tokens(
        len(prompt_ids), params.max_tokens, engine.max_model_len, "messages"
    )
    tail = engine.tokenizer.decode(prompt_ids[-8:], False)
    thinking = _thinking(state, request, enable_thinking, tail)
    specials = _marker_tokens(engine.tokenizer)
    if any(engine.tokenizer.special_id(m) is not None for m in specials):
        params.skip_special_tokens = False  # the parsers must see markers that are control tokens
    plan = _plan(request, setup.tool_format if calls_on else "none", thinking, specials)
    text = plan.grammar()
    if text is not None:
        user = request.params.constraint
        param = "tools" if plan.forced else user.param if user else "max_thinking_tokens"
        params.constraint = Constraint("lark", text, param=param)
    return PreparedChat(
        request,
        prompt_ids,
        params,
        setup,
        plan.fmt,
        thinking is not None and thinking.opened,
        None if request.parallel_tool_calls else 1,
        plan.forced,
    )


def _prepare_harmony(state: ServedModel, request: ChatRequest, calls_on: bool) -> PreparedChat:
    """The prompt rendered by openai-harmony; a forced call, or the final message's JSON
    (response_format), constrained in harmony's syntax."""
    from met.chat import harmony

    user = request.params.constraint
    if user is not None and user.kind not in ("json_schema", "json_object"):
        param = user.param or "response_format"
        raise invalid(
            f"{param}: with harmony only JSON (response_format json_schema or json_object) "
            "constrains the final message",
            param,
        )
    prompt_ids = harmony.render(request, calls_on)
    params = copy.deepcopy(request.params)
    params.max_tokens = fit_max_tokens(
        len(prompt_ids), params.max_tokens, state.engine.max_model_len, "messages"
    )
    params.stop_token_ids = list(dict.fromkeys([*params.stop_token_ids, *harmony.stop_token_ids()]))
    choice = request.tool_choice
    budget = request.max_thinking_tokens
    if budget is None and request.reasoning_effort is not None:
        budget = EFFORT_BUDGETS.get(request.reasoning_effort)
    if budget is None:
        budget = state.settings.max_thinking_tokens
    if calls_on and (choice == "required" or isinstance(choice, dict)):
        # A forced call's turn holds no final message to shape (as _plan: the calls win).
        named = named_tool(request)
        tools = [named] if named is not None else list(request.tools)
        grammar = harmony.forced_call_grammar(tools, budget)
        params.constraint = Constraint("lark", grammar, param="tools")
    elif user is not None:
        schema = user.value if user.kind == "json_schema" else None
        grammar = harmony.final_json_grammar(
            schema, list(request.tools) if calls_on else [], budget
        )
        params.constraint = Constraint("lark", grammar, param=user.param or "response_format")
    elif budget is not None:
        grammar = harmony.thinking_budget_grammar(budget, state.engine.tokenizer.vocab_size)
        params.constraint = Constraint("lark", grammar, param="max_thinking_tokens")
    max_calls = None if request.parallel_tool_calls else 1
    return PreparedChat(request, prompt_ids, params, state.chat_setup, HARMONY, False, max_calls)


def _thinking(
    state: ServedModel, request: ChatRequest, enable: bool | None, tail: str
) -> Thinking | None:
    """Whether (and how) the output may begin with thinking; None when it cannot."""
    if state.chat_setup.reasoning is None:
        return None
    open_tag, close_tag = REASONING_TAGS[state.chat_setup.reasoning]
    at = tail.rfind(open_tag)
    opened = at >= 0 and close_tag not in tail[at:]
    if not opened and (close_tag in tail or enable is False):
        return None  # the template closed the think block: no thinking this turn
    budget = request.max_thinking_tokens
    if budget is None and request.reasoning_effort is not None:
        budget = EFFORT_BUDGETS.get(request.reasoning_effort)
    if budget is None:
        budget = state.settings.max_thinking_tokens
    return Thinking(opened, budget, open_tag, close_tag)


@functools.cache
def _marker_tokens(tokenizer: Any) -> dict[str, int]:
    """The markers that are one token of the model, by id (control tokens or added text)."""
    out = {}
    for marker in MARKERS:
        token = tokenizer.special_id(marker)
        if token is None:
            ids = tokenizer.encode(marker)
            token = ids[0] if len(ids) == 1 else None
        if token is not None:
            out[marker] = token
    return out


def _plan(
    request: ChatRequest, fmt: str, thinking: Thinking | None, specials: dict[str, int]
) -> Plan:
    choice = request.tool_choice
    forced = fmt != "none" and (choice == "required" or isinstance(choice, dict))
    named = named_tool(request)
    user = request.params.constraint
    kind = user.kind if user is not None else None
    return Plan(
        fmt=fmt,
        tools=[named] if named is not None else list(request.tools),
        forced=forced,
        parallel=request.parallel_tool_calls and named is None,
        thinking=thinking,
        schema=user.value if kind == "json_schema" else None,
        json_mode=kind == "json_object",
        specials=specials,
    )


def _history_end(
    engine: Any, messages: list[dict[str, Any]], kwargs: dict[str, Any], prompt_ids: list[int]
) -> int | None:
    """For a model that resumes prompts from state checkpoints (a hybrid), how many prompt tokens
    the history rendered without the generation prompt shares with the prompt: the next turn
    repeats those, while templates render a past reply unlike what its generation prompt began
    (Qwen3.5's empty think block)."""
    if not getattr(engine, "keeps_state_checkpoints", False):
        return None
    try:
        history = engine.tokenizer.encode_chat(
            messages, **{**kwargs, "add_generation_prompt": False}
        )
    except ValueError:  # a template that insists on its generation prompt
        return None
    return common_prefix(history, prompt_ids)


def render(engine: Any, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> list[int]:
    """Token ids of the chat template applied to template dicts, generation prompt included."""
    try:
        return engine.tokenizer.encode_chat(messages, **kwargs)
    except ValueError as e:  # the template's own checks (role order, ...) judge the client's input
        log.info("chat template rejected the messages: %s", e)
        raise invalid(f"messages: the chat template rejected them: {e}", "messages") from None


def _check_tools(request: ChatRequest) -> None:
    names: set[str] = set()
    for i, tool in enumerate(request.tools):
        if not _TOOL_NAME.match(tool.name):
            raise invalid(
                f"tools[{i}].function.name: {tool.name!r} must be 1-64 letters, digits, "
                "'_', '-', '.' or ':'",
                param="tools",
            )
        if tool.name in names:
            raise invalid(f"tools[{i}].function.name: {tool.name!r} is defined twice", "tools")
        names.add(tool.name)
        _check_schema(i, tool)
    choice = request.tool_choice
    if isinstance(choice, dict):
        if choice.get("name") not in names:
            raise invalid(
                f"tool_choice: no tool named {choice.get('name')!r} among the tools given",
                param="tool_choice",
            )
    elif choice not in ("none", "auto", "required"):
        raise invalid(
            f"tool_choice: {choice!r} is not one of 'none', 'auto', 'required' or a named function",
            param="tool_choice",
        )
    elif choice == "required" and not request.tools:
        raise invalid("tool_choice: 'required' needs at least one tool", param="tool_choice")


def _check_schema(i: int, tool: ToolSpec) -> None:
    """A schema the grammar engine cannot enforce is refused now, naming the tool."""
    from met.constraints import check  # llguidance loads when a request first needs it

    where = f"tools[{i}].function.parameters"
    if not isinstance(tool.parameters, dict):
        raise invalid(f"{where}: must be a JSON Schema object", "tools")
    try:
        check(Constraint("json_schema", tool.parameters, param=where))
    except ValueError as e:
        raise invalid(str(e), "tools") from None


def named_tool(request: ChatRequest) -> ToolSpec | None:
    if isinstance(request.tool_choice, dict):
        return next(t for t in request.tools if t.name == request.tool_choice["name"])
    return None


class ChatRun:
    """A prepared chat running as one Generation: typed events per choice, and the usage."""

    def __init__(self, prepared: PreparedChat, gen: Generation) -> None:
        self.prepared = prepared
        self.gen = gen
        self.parsers = [prepared.parser() for _ in range(gen.n)]
        self.reasoning_tokens = [0] * gen.n
        # With prompt_logprobs: the prompt's (every choice shares it), from the first delta.
        self.prompt_logprobs: list[TokenLogprob | None] | None = None

    @classmethod
    async def start(
        cls, state: ServedModel, prepared: PreparedChat, request_id: str, http: Request
    ) -> ChatRun:
        gen = Generation(state, request_id, prepared.prompt_ids, prepared.params)
        await gen.start(http)
        return cls(prepared, gen)

    def on_delta(self, index: int, delta: CompletionDelta) -> list[ChatEvent]:
        """The events one engine delta of choice `index` makes."""
        parser = self.parsers[index]
        if parser.thinking:
            self.reasoning_tokens[index] += len(delta.token_ids)
        events: list[ChatEvent] = []
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        if delta.logprobs:
            events.append(Logprobs(delta.logprobs))
        events += parser.feed_output(delta.token_ids, delta.text)
        if delta.finished:
            events += parser.finish()
            reason = public_finish_reason(delta.finish_reason, self.gen.request_id) or "stop"
            if reason == "stop" and parser.tools.calls:
                reason = "tool_calls"
                # The request's log line and metrics label say so too.
                self.gen.finish_reasons[index] = reason
            events.append(Finish(reason, delta.stop_sequence))
        return events

    async def events(self) -> AsyncIterator[tuple[int, ChatEvent]]:
        """(choice index, event) in arrival order; each choice ends with one Finish."""
        async for index, delta in self.gen.deltas():
            if delta.finish_reason == "abort":
                self.gen.raise_if_aborted()
            for event in self.on_delta(index, delta):
                yield index, event

    async def collect(self, http: Request) -> list[ChatResult]:
        """Run to completion (aborted if the client leaves); each choice's events accumulated."""
        results = [ChatResult() for _ in range(self.gen.n)]

        def add(index: int, delta: CompletionDelta) -> None:
            for event in self.on_delta(index, delta):
                results[index].add(event)

        await self.gen.collect(http, on_delta=add)
        return results

    def usage(self) -> Usage:
        gen = self.gen
        return Usage(
            len(gen.prompt_ids),
            sum(gen.completion_tokens),
            gen.cached_tokens,
            sum(self.reasoning_tokens),
        )
