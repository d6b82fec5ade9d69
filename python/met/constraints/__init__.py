"""Structured output on llguidance: JSON Schema, JSON mode, regex, choice, Lark and GBNF.

A request asks with `SamplingParams(constraint=Constraint(kind, value, param))`
(met.sampling):

    Constraint("json_schema", {"type": "object", ...})    # a schema (dict)
    Constraint("json_object")                             # any JSON object
    Constraint("regex", r"[0-9]{3}-[0-9]{4}")             # the whole output matches it
    Constraint("choice", ["yes", "no"])                   # exactly one of them
    Constraint("lark", grammar_text)                      # llguidance's Lark dialect
    Constraint("gbnf", grammar_text)                      # llama.cpp's GBNF (converted)

`param` is the request field named by the 400 when the constraint is refused
("response_format", "structured_outputs.grammar", "tool_choice", ...).

Lark grammars (llguidance's dialect, docs/syntax.md of llguidance) may embed JSON schemas and
name the model's special tokens, so a forced tool call is one grammar:

    start: <tool_call> "\\n" %json{"type": "object", "properties": {...}} "\\n" </tool_call>

`<name>` is a special (control) token of the model by its text (`<tool_call>`,
`<|python_tag|>`), `<[id]>` one by id. Stop tokens (every EOS id of the model) cannot be named:
they are llguidance's end of text, allowed exactly where the grammar is complete, and the
output ends there; naming one is a 400. Schemas inside `%json{...}` are taken as written
(closed_objects below is not applied; write "additionalProperties": false where wanted), with
llguidance's default whitespace.

Errors: `met.constraints.check(c)` (what SamplingParams.validate calls, no tokenizer needed)
and the engine's check against the model's tokenizer (EngineCore.check_request, before anything
is queued) raise ValueError("<param>: <why>"), which the server turns into a 400 in OpenAI's
shape naming `param`: unknown or unenforceable keywords (`uniqueItems`, `contains`, `not`,
`if`, look-around in a regex), malformed schemas, regexes or grammars, constraints over
MAX_CONSTRAINT_BYTES, nested deeper than MAX_SCHEMA_DEPTH or over llguidance's parser limits.
A matcher that fails later, mid-output (llguidance's per-step limits), allows only the stop
tokens from then on: the output ends there.

Schema semantics: JSON Schema as llguidance enforces it (pattern, lengths, numeric bounds,
multipleOf, allOf, anyOf, oneOf, prefixItems, format, local $ref, ...). An object schema with
`properties` and no `additionalProperties` takes no other keys (OpenAI's strict mode and
llama.cpp; closed_objects), except inside allOf members. Whitespace between JSON tokens is
bounded (compile.JSON_WHITESPACE) and none comes before or after the value, so the output ends
as soon as the value is complete.

Engine side: ModelGrammar (one per model) builds the llguidance tokenizer once and caches the
compiled grammars; each sequence gets its SequenceGrammar (sync to the output, rollback(k) for
speculative drafts); MaskPrefetch computes the next step's bitmasks while the forward runs;
met.model.sampler.apply_masks puts them on the logits.
"""

from met.constraints.compile import (
    JSON_WHITESPACE,
    MAX_CONSTRAINT_BYTES,
    MAX_SCHEMA_DEPTH,
    check,
    closed_objects,
    grammar_kind,
    grammar_text,
)
from met.constraints.masks import MaskPrefetch
from met.constraints.state import ModelGrammar, SequenceGrammar

__all__ = [
    "JSON_WHITESPACE",
    "MAX_CONSTRAINT_BYTES",
    "MAX_SCHEMA_DEPTH",
    "MaskPrefetch",
    "ModelGrammar",
    "SequenceGrammar",
    "check",
    "closed_objects",
    "grammar_kind",
    "grammar_text",
]
