"""Which tool-call format and reasoning parser a model's chat template calls for (or the flags
say), decided once per served model."""

from __future__ import annotations

from dataclasses import dataclass

TOOL_FORMATS = ("hermes", "llama3_json", "mistral", "qwen3_coder", "pythonic", "gemma4", "generic")
# qwen3 and deepseek_r1 split <think>...</think>, gemma4 <|channel>thought...<channel|>.
REASONING_PARSERS = ("qwen3", "deepseek_r1", "gemma4")
# gpt-oss's harmony (met.chat.harmony): the library renders the prompt and parses channels, for
# tools and reasoning at once; chosen by the template (its <|channel|>), not by a flag.
HARMONY = "harmony"


@dataclass(frozen=True)
class ChatSetup:
    tool_format: str  # one of TOOL_FORMATS, or "none" (tools refused)
    tool_source: str  # "template" | "flag" | "no tool support in the template"
    reasoning: str | None  # a REASONING_PARSERS name, or None
    template_tools: bool  # the template renders `tools` itself

    def describe(self) -> dict[str, str | None]:
        return {
            "tool_call_format": self.tool_format,
            "tool_call_format_source": self.tool_source,
            "reasoning_parser": self.reasoning,
        }


def detect_tool_format(template: str | None) -> str | None:
    """The format a template writes calls in, or None when it does not take tools."""
    if not template or "tools" not in template:
        return None
    if "<|tool_call>" in template:
        return "gemma4"
    if "<function=" in template and "<tool_call>" in template:
        return "qwen3_coder"
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "[func_name1(" in template or "<|python_start|>" in template:
        return "pythonic"
    if "<|python_tag|>" in template or ("ipython" in template and '"parameters"' in template):
        return "llama3_json"
    return None


def _detect_reasoning(template: str | None) -> str | None:
    if template and "<|channel>thought" in template:
        return "gemma4"
    return "qwen3" if template and "<think>" in template else None


def resolve_setup(
    template: str | None, tool_parser: str | None, reasoning_parser: str | None
) -> ChatSetup:
    if template and "<|channel|>" in template and tool_parser in (None, "auto", HARMONY):
        reasoning = None if reasoning_parser == "none" else HARMONY
        return ChatSetup(HARMONY, "template", reasoning, template_tools=False)
    detected = detect_tool_format(template)
    if tool_parser in (None, "auto"):
        fmt = detected or "generic"
        source = "template" if detected else "no tool support in the template"
    else:
        fmt, source = tool_parser, "flag"
    if reasoning_parser in (None, "auto"):
        reasoning = _detect_reasoning(template)
    else:
        reasoning = None if reasoning_parser == "none" else reasoning_parser
    # A flag choosing a format the template does not write still gets the template's rendering
    # of tools when it has one; the generic format always describes them itself.
    template_tools = detected is not None and fmt not in ("generic", "none")
    return ChatSetup(fmt, source, reasoning, template_tools)
