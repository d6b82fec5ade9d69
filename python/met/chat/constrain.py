"""Lark grammars (llguidance) that force what a request requires: tool calls in the model's own
format with each tool's arguments as `%json` of its schema, the generic envelope, and the end of
thinking once its token budget is spent (tool_choice auto is not constrained: the model writes
freely and the parser reads the calls it wrote). A marker that is one token of the model (`<think>`,
`[TOOL_CALLS]`, `<|python_tag|>`, Qwen's `<tool_call>`) is named as that token (`<[id]>`), else
written as text."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field

from met.chat.types import ToolSpec

log = logging.getLogger("met.chat")

# Compact, fixed JSON layout: the model spends no tokens on whitespace inside forced calls.
_LAYOUT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}

# reasoning_effort -> thinking budget in tokens when the request sets none (None: no cap).
EFFORT_BUDGETS = {"minimal": 256, "low": 1024, "medium": 4096, "high": None}


@dataclass(frozen=True)
class Thinking:
    opened: bool  # the prompt already opened the think block
    budget: int | None  # tokens of thinking before the end marker is forced
    open_tag: str = "<think>"  # the block's markers (Gemma 4: its thought channel's)
    close_tag: str = "</think>"


def _regex_text(text: str) -> str:
    """`text` matched literally inside a Lark /regex/."""
    return re.escape(text).replace("/", "\\/")


def lit(text: str) -> str:
    """A Lark string literal (JSON's escapes are Lark's)."""
    return json.dumps(text, ensure_ascii=False)


def json_rule(schema: dict) -> str:
    """`%json` of a schema; objects take only the keys they declare (as met's structured
    output does, OpenAI's strict mode and llama.cpp)."""
    from met.constraints import closed_objects

    closed = {"x-guidance": _LAYOUT, **closed_objects(schema)}
    return "%json " + json.dumps(closed, ensure_ascii=False)


@dataclass(frozen=True)
class Plan:
    """What the output must follow, decided from the request and the model's chat setup."""

    fmt: str  # the tool-call format ("none": no calls)
    tools: list[ToolSpec]  # the tools a forced call may use (all of them, or the named one)
    forced: bool  # required or named: at least one call
    parallel: bool
    thinking: Thinking | None
    schema: dict | None = None  # response_format to keep after thinking (json kinds)
    json_mode: bool = False
    specials: dict[str, int] = field(default_factory=dict)  # markers that are one token

    def grammar(self) -> str | None:
        """The whole Lark grammar, or None when nothing needs constraining."""
        if self.forced:
            body = self._calls()
        elif self.thinking is not None and (self.schema is not None or self.json_mode):
            body = [f"body: {json_rule(self.schema or {'type': 'object'})}"]
        elif self.thinking is not None and self.thinking.budget is not None:
            body = ["body: /(?s:.*)/"]
        else:
            return None
        return "\n".join(["%llguidance {}", *self._start(), *body]) + "\n"

    def _opener(self, tag: str) -> str:
        """The block's opening marker: its token, or (Gemma 4's <|channel>thought) the token of
        its first marker and the rest as text."""
        head = next((m for m in self.specials if tag.startswith(m) and m != tag), None)
        if tag in self.specials or head is None:
            return self._token(tag)
        return f"{self._token(head)} {lit(tag.removeprefix(head))}"

    def _token(self, text: str) -> str:
        """A marker: its token by id where it is one token of the model, else its text."""
        return f"<[{self.specials[text]}]>" if text in self.specials else lit(text)

    def _start(self) -> list[str]:
        thinking = self.thinking
        if thinking is None:
            return ["start: body"]
        cap = "" if thinking.budget is None else f"[max_tokens={max(thinking.budget, 1)}]"
        close = _regex_text(thinking.close_tag)
        if thinking.close_tag in self.specials:
            # The thinking text cannot hold the end marker, which follows it as its token: the
            # model may write that token at any point, and at the budget it is the only choice.
            # llguidance takes `&` in a lexeme (upper case) only, and a budget on a rule only.
            no_close = f"/(?s:.*)/ & ~/(?s:.*){close}(?s:.*)/"
            rules = [
                f"THINK_TEXT: {no_close}",
                f"think_text{cap}: THINK_TEXT",
                f"think_end: think_text {self._token(thinking.close_tag)}",
            ]
        else:  # the marker is several tokens: the text ends at its first occurrence
            if cap:
                log.warning(
                    "%s is not one token of this model: the thinking budget is not enforced",
                    thinking.close_tag,
                )
            rules = [f"think_end[lazy]: /(?s:.*){close}/"]
        rules.append("think_gap: /\\n{0,2}/")
        opener = self._opener(thinking.open_tag)
        if thinking.opened:
            return [*rules, "start: think_end think_gap body"]
        # A model whose template thinks writes the block (Qwen3 an empty one when told not to
        # think in the prompt), so it is part of the grammar, not optional.
        return [*rules, f"start: {opener} think_end think_gap body"]

    def _calls(self) -> list[str]:
        rules = [f"args_{i}: {json_rule(t.parameters)}" for i, t in enumerate(self.tools)]
        rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(self.tools))))
        rules += [f"call_{i}: {self._call(t, i)}" for i, t in enumerate(self.tools)]
        sep, head, tail = self._list()
        many = f"call ({lit(sep)} call)*" if sep else "call+"  # gemma4: back to back
        many = many if self.parallel else "call"
        rules.append(" ".join(filter(None, ["body:", head, many, tail])))
        return rules

    def _list(self) -> tuple[str, str, str]:
        """(separator between calls, before the first, after the last)."""
        if self.fmt in ("hermes", "qwen3_coder"):
            return "\n", "", ""
        if self.fmt == "llama3_json":
            return "; ", "", ""
        if self.fmt == "mistral":
            return ", ", self._token("[TOOL_CALLS]") + ' "["', '"]"'
        if self.fmt == "pythonic":
            return ", ", '"["', '"]"'
        if self.fmt == "gemma4":
            return "", "", ""
        if self.parallel:  # generic
            return ", ", lit('{"tool_calls": ['), lit("]}")
        return ", ", lit('{"tool_call": '), lit("}")

    def _call(self, tool: ToolSpec, i: int) -> str:
        name = json.dumps(tool.name)
        key = "parameters" if self.fmt == "llama3_json" else "arguments"
        head = lit('{"name": ' + name + ', "' + key + '": ')
        if self.fmt == "hermes":
            opener, closer = self._token("<tool_call>"), self._token("</tool_call>")
            return f'{opener} "\\n" {head} args_{i} "}}\\n" {closer}'
        if self.fmt in ("llama3_json", "mistral", "generic"):
            return f'{head} args_{i} "}}"'
        if self.fmt == "qwen3_coder":
            return self._coder_call(tool)
        if self.fmt == "pythonic":
            return _pythonic_call(tool)
        if self.fmt == "gemma4":
            return self._gemma4_call(tool)
        raise ValueError(f"tool_choice: the {self.fmt} format cannot force a call")

    def _coder_call(self, tool: ToolSpec) -> str:
        parts = [self._token("<tool_call>"), lit("\n<function=" + tool.name + ">\n")]
        for key, schema, required in _properties(tool):
            opener = lit("<parameter=" + key + ">\n")
            value = _coder_text(schema) if schema.get("type") == "string" else json_rule(schema)
            item = "(" + opener + " " + value + " " + lit("\n</parameter>\n") + ")"
            parts.append(item if required else item + "?")
        parts += [lit("</function>\n"), self._token("</tool_call>")]
        return " ".join(parts)

    def _gemma4_call(self, tool: ToolSpec) -> str:
        """`<|tool_call>call:NAME{k:v,...}<tool_call|>`: keyword arguments in schema order, the
        required ones always; strings between <|"|> markers (as qwen3_coder's: an enum's values,
        or text without '<'), other values JSON (the parser reads JSON's strings too)."""
        quote = self._token('<|"|>')
        parts, first = [self._token("<|tool_call>"), lit(f"call:{tool.name}{{")], True
        for key, schema, required in _properties(tool):
            value = json_rule(schema)
            if schema.get("type") == "string":
                value = f"{quote} {_coder_text(schema)} {quote}"
            text = f"{lit(key + ':')} {value}"
            piece = text if first else f'"," {text}'
            parts.append(f"({piece})" if required else f"({piece})?")
            first = first and not required
        parts += ['"}"', self._token("<tool_call|>")]
        return " ".join(parts)


def _properties(tool: ToolSpec) -> list[tuple[str, dict, bool]]:
    props = tool.parameters.get("properties") or {}
    required = set(tool.parameters.get("required") or [])
    return [
        (key, schema if isinstance(schema, dict) else {}, key in required)
        for key, schema in props.items()
    ]


def _coder_text(schema: dict) -> str:
    """A string parameter as qwen3_coder writes it: raw text up to the closing tag (an enum's
    values, or as long as the schema's length bounds allow)."""
    if isinstance(schema.get("enum"), list) and all(isinstance(v, str) for v in schema["enum"]):
        return "(" + " | ".join(lit(v) for v in schema["enum"]) + ")"
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    return f"/[^<]{{{int(low)},{'' if high is None else int(high)}}}/"


def _pythonic_call(tool: ToolSpec) -> str:
    """`name(k=v, ...)`: keyword arguments in schema order, the required ones always, each
    value JSON (the parser reads true/false/null too)."""
    parts, first = [lit(f"{tool.name}(")], True
    for key, schema, required in _properties(tool):
        text = f"{lit(key + '=')} {json_rule(schema)}"
        piece = text if first else f'", " {text}'
        parts.append(f"({piece})" if required else f"({piece})?")
        first = first and not required
    parts.append('")"')
    return " ".join(parts)
