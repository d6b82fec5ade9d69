"""Modal screens: key help and the quit confirmation."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

HELP_TEXT = """[b]met dashboard[/b]

  1 / 2 / 3 / 4   overview / requests / logs / chat
  Tab, Shift+Tab  next / previous pane
  /               filter the log lines
  ?               this help
  Esc             leave a text box (so keys work again)
  q               quit (asks first while requests are in flight)
  Ctrl+C          quit now

When the dashboard started the server (met serve), quitting drains the
requests in flight and stops the server.

Press any key to close."""


class HelpScreen(ModalScreen[None]):
    def compose(self) -> ComposeResult:
        yield Vertical(Static(HELP_TEXT), id="dialog")

    def on_key(self) -> None:
        self.dismiss()


class ConfirmQuit(ModalScreen[bool]):
    BINDINGS = [
        Binding("y", "answer(True)", "yes"),
        Binding("n,escape,q", "answer(False)", "no"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        yield Vertical(Static(f"{self.question}\n\n[b]y[/b] quit   [b]n[/b] stay"), id="dialog")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)
