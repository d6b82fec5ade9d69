"""Splits reasoning off the front of the output: `<think>...</think>` (Qwen3, DeepSeek-R1) or
Gemma 4's thought channel, `<|channel>thought ...<channel|>`."""

from __future__ import annotations

from met.chat.parsers.base import partial_prefix

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CHANNEL, CHANNEL_CLOSE = "<|channel>", "<channel|>"
CHANNEL_OPEN = CHANNEL + "thought"
# Each reasoning parser's (opening, closing) markers.
REASONING_TAGS = {
    "qwen3": (THINK_OPEN, THINK_CLOSE),
    "deepseek_r1": (THINK_OPEN, THINK_CLOSE),
    "gemma4": (CHANNEL_OPEN, CHANNEL_CLOSE),
}


class ReasoningSplitter:
    """Text in, (is_reasoning, text) pieces out. Only a think block at the very start of the
    output (or one the prompt already opened) is reasoning; later tags are plain text."""

    def __init__(
        self, inside: bool = False, open_tag: str = THINK_OPEN, close_tag: str = THINK_CLOSE
    ) -> None:
        self.open_tag, self.close_tag = open_tag, close_tag
        self.state = "inside" if inside else "start"
        self._buf = ""

    @property
    def thinking(self) -> bool:
        return self.state == "inside"

    def feed(self, text: str) -> list[tuple[bool, str]]:
        self._buf += text
        out: list[tuple[bool, str]] = []
        if self.state == "start":
            stripped = self._buf.lstrip()
            if self.open_tag.startswith(stripped):
                return out  # nothing but (the start of) the opening tag yet
            if stripped.startswith(self.open_tag):
                self._buf = stripped[len(self.open_tag) :]
                self.state = "inside"
            else:
                self.state = "after"
        if self.state == "inside":
            at = self._buf.find(self.close_tag)
            if at < 0:
                hold = partial_prefix(self._buf, (self.close_tag,))
                self._emit(out, True, self._buf[: len(self._buf) - hold])
                self._buf = self._buf[len(self._buf) - hold :]
                return out
            self._emit(out, True, self._buf[:at])
            self._buf = self._buf[at + len(self.close_tag) :].lstrip()
            self.state = "after" if self._buf else "closed"
        if self.state == "closed":  # drop the blank lines that follow the closing tag
            self._buf = self._buf.lstrip()
            if not self._buf:
                return out
            self.state = "after"
        self._emit(out, False, self._buf)
        self._buf = ""
        return out

    def finish(self) -> list[tuple[bool, str]]:
        rest, self._buf = self._buf, ""
        if not rest:
            return []
        # Cut inside the thinking (a limit): what there is was reasoning.
        return [(self.state == "inside", rest)]

    @staticmethod
    def _emit(out: list[tuple[bool, str]], reasoning: bool, text: str) -> None:
        if text:
            out.append((reasoning, text))
