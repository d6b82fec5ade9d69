"""A Constraint as llguidance grammar text, and its admission check (bounded in size and work)."""

from __future__ import annotations

import json
import re
from typing import Any

import llguidance as llg

from met.sampling import Constraint

# Text of a constraint (its JSON for a schema) above this is refused before compiling: with
# the parser limits below it bounds the work a request can ask of the compiler.
MAX_CONSTRAINT_BYTES = 256 * 1024
MAX_SCHEMA_DEPTH = 64  # nested objects/lists of a schema (Python recursion stays far away)
# A whitespace run holds at most one line break and 20 spaces or tabs either side of it (as
# llama.cpp's JSON grammar): a weak model could otherwise pad an object with blank lines until
# max_tokens without ever breaking the grammar. No whitespace before or after the value.
JSON_WHITESPACE = r"[ \t]{0,20}(?:\r?\n[ \t]{0,20})?"
_JSON_OPTIONS = {"whitespace_flexible": False, "whitespace_pattern": JSON_WHITESPACE}
# GBNF rules are written `name ::= ...`, Lark rules `name: ...`.
_GBNF_RULE = re.compile(r"^\s*[A-Za-z0-9_-]+\s*::=", re.MULTILINE)
# Schema keywords by what their value holds: one subschema, a list of them, a map to them.
_SUBSCHEMA = ("items", "additionalProperties", "not", "contains", "propertyNames", "if")
_SUBSCHEMA += ("then", "else", "additionalItems", "unevaluatedItems", "unevaluatedProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def limits() -> llg.LLParserLimits:
    """Per-matcher bounds (defaults of llguidance, whose errors must not echo the schema)."""
    return llg.LLParserLimits(verbose_errors=False)


def grammar_kind(text: str) -> str:
    """'gbnf' when the grammar is written in GBNF (rules with `::=`), else 'lark'."""
    return "gbnf" if _GBNF_RULE.search(text) else "lark"


def grammar_text(c: Constraint) -> str:
    """llguidance's grammar for `c`; ValueError("<param>: <why>") when its value is malformed."""
    value = c.value
    if c.kind == "json_object":
        return llg.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=_JSON_OPTIONS)
    if c.kind == "json_schema":
        if not isinstance(value, dict):
            raise ValueError(f"{c.param}: a JSON schema must be an object")
        if _depth(value) > MAX_SCHEMA_DEPTH:
            raise ValueError(f"{c.param}: the schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
        _bounded(c, json.dumps(value))
        schema = closed_objects(value)
        return llg.LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_OPTIONS)
    if c.kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{c.param}: must be a non-empty list of strings")
        _bounded(c, json.dumps(value))
        return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(map(json.dumps, value)))
    if not isinstance(value, str) or not value:
        raise ValueError(f"{c.param}: must be a non-empty string")
    _bounded(c, value)
    if c.kind == "regex":
        return llg.LLMatcher.grammar_from_regex(value)
    if c.kind == "gbnf":
        try:
            return llg.grammar_from("gbnf", value)
        except ValueError as e:
            raise ValueError(f"{c.param}: {one_line(str(e))}") from None
    if c.kind == "lark":
        return llg.LLMatcher.grammar_from_lark(value)
    raise ValueError(f"{c.param}: unknown constraint kind {c.kind!r}")


def check(c: Constraint, tokenizer: llg.LLTokenizer | None = None) -> str:
    """Compiles `c` (against the model's tokenizer when given) and returns the grammar; a
    keyword llguidance cannot enforce, a malformed schema, regex or grammar, or one over the
    limits is ValueError("<param>: <why>")."""
    grammar = grammar_text(c)
    error = llg.LLMatcher.validate_grammar(grammar, tokenizer, limits=limits())
    if error:
        raise ValueError(f"{c.param}: {one_line(error)}")
    return grammar


def closed_objects(schema: Any) -> Any:
    """The schema with additionalProperties: false added to every object schema that declares
    properties and says nothing of other keys (OpenAI's strict mode, llama.cpp and met before
    llguidance: extra keys only where the schema allows them). allOf members are left as the
    spec reads them: closing each would forbid the keys the other members declare."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    for key in _SUBSCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = closed_objects(out[key])
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(s) for s in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(s) for name, s in out[key].items()}
    return out


def _depth(value: Any) -> int:
    """How deep dicts and lists nest in `value`, without recursing."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list) and depth <= MAX_SCHEMA_DEPTH:
            deepest = max(deepest, depth)
            stack.extend(
                (v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)
            )
        elif isinstance(item, dict | list):
            return depth
    return deepest


def _bounded(c: Constraint, text: str) -> None:
    size = len(text.encode())
    if size > MAX_CONSTRAINT_BYTES:
        raise ValueError(
            f"{c.param}: {size} bytes is over the {MAX_CONSTRAINT_BYTES}-byte limit of a "
            "structured-output constraint"
        )


def one_line(error: str, limit: int = 400) -> str:
    """llguidance's message without its source excerpts' caret lines, on one line and short
    (it may quote the grammar)."""
    lines = [line.strip() for line in error.splitlines()]
    text = " ".join(line for line in lines if line and not set(line) <= set("^| "))
    return text if len(text) <= limit else text[: limit - 3] + "..."
