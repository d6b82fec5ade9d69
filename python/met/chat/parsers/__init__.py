"""Output parsers: the reasoning splitter and one tool-call parser per format."""

from __future__ import annotations

from met.chat.parsers.base import NoTools, ToolParser
from met.chat.parsers.gemma4 import Gemma4Parser
from met.chat.parsers.generic import GenericParser
from met.chat.parsers.hermes import HermesParser, Qwen3CoderParser
from met.chat.parsers.jsonish import Llama3JsonParser, MistralParser
from met.chat.parsers.pythonic import PythonicParser
from met.chat.parsers.reasoning import ReasoningSplitter
from met.chat.types import ChatEvent, ReasoningDelta, TextDelta

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    parser.name: parser
    for parser in (
        NoTools,
        HermesParser,
        Qwen3CoderParser,
        Llama3JsonParser,
        MistralParser,
        PythonicParser,
        GenericParser,
        Gemma4Parser,
    )
}


class ChoiceParser:
    """One choice's output: reasoning split off first, the rest through the tool parser."""

    def __init__(self, tools: ToolParser, reasoning: ReasoningSplitter | None = None) -> None:
        self.tools = tools
        self.reasoning = reasoning

    @property
    def thinking(self) -> bool:
        return self.reasoning is not None and self.reasoning.thinking

    def feed_output(self, token_ids: list[int], text: str) -> list[ChatEvent]:
        """One engine delta: these parsers read its text (harmony's reads the tokens)."""
        return self.feed(text)

    def feed(self, text: str) -> list[ChatEvent]:
        if self.reasoning is None:
            return self.tools.feed(text)
        return self._route(self.reasoning.feed(text), final=False)

    def finish(self) -> list[ChatEvent]:
        if self.reasoning is None:
            return self.tools.finish()
        return self._route(self.reasoning.finish(), final=True)

    def _route(self, pieces: list[tuple[bool, str]], final: bool) -> list[ChatEvent]:
        events: list[ChatEvent] = []
        for is_reasoning, text in pieces:
            events += [ReasoningDelta(text)] if is_reasoning else self.tools.feed(text)
        if final:
            events += self.tools.finish()
        return _merge_text(events)


def _merge_text(events: list[ChatEvent]) -> list[ChatEvent]:
    out: list[ChatEvent] = []
    for event in events:
        if out and type(event) in (TextDelta, ReasoningDelta) and type(out[-1]) is type(event):
            out[-1] = type(event)(out[-1].text + event.text)
        else:
            out.append(event)
    return out
