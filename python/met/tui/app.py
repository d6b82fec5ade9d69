"""The live dashboard: polls a server's /status and /metrics and shows them, with a chat tab."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from rich.markup import escape
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Input, Static, TabbedContent, TabPane

from met.tui.client import ServerUnreachableError, StatusClient
from met.tui.metrics import Figures, History, Reading, ReadingWindow, derive
from met.tui.panes import ChatPane, LogPane, Overview, RequestsPane, startup_text
from met.tui.screens import ConfirmQuit, HelpScreen
from met.tui.server_process import ServerProcess

PANES = ("overview", "requests", "logs", "chat")


class Dashboard(App[None]):
    TITLE = "met"
    CSS_PATH = "dashboard.tcss"
    BINDINGS = [
        Binding("1", "show_pane('overview')", "overview"),
        Binding("2", "show_pane('requests')", "requests"),
        Binding("3", "show_pane('logs')", "logs"),
        Binding("4", "show_pane('chat')", "chat"),
        Binding("tab", "cycle_pane(1)", "next pane", show=False, priority=True),
        Binding("shift+tab", "cycle_pane(-1)", "previous pane", show=False, priority=True),
        Binding("slash", "filter_logs", "filter logs"),
        Binding("question_mark", "help", "help"),
        Binding("escape", "leave_input", show=False),
        Binding("q", "request_quit", "quit"),
        Binding("ctrl+c", "quit_now", "quit now", show=False, priority=True),
    ]

    def __init__(
        self,
        url: str,
        server: ServerProcess | None = None,
        poll_interval: float = 1.0,
        chat_max_tokens: int = 512,
    ) -> None:
        super().__init__()
        self.url = url
        self.chat_max_tokens = chat_max_tokens
        self.server = server
        self.poll_interval = poll_interval
        self.client = StatusClient(url)
        self.status: dict[str, Any] | None = None
        self.window = ReadingWindow()
        self.figures = Figures()
        self.history = History()
        self.polls = 0
        self.chat_history: list[dict[str, str]] = []
        self._seen_logs: list[str] = []

    def compose(self) -> ComposeResult:
        yield Static("", id="title")
        with TabbedContent(initial="overview", id="panes"):
            with TabPane("1 Overview", id="overview"):
                yield Overview()
            with TabPane("2 Requests", id="requests"):
                yield RequestsPane()
            with TabPane("3 Logs", id="logs"):
                yield LogPane()
            with TabPane("4 Chat", id="chat"):
                yield ChatPane()
        yield Footer()

    def on_mount(self) -> None:
        self._show_title()
        self.query_one("#startup", Static).update(startup_text(None, self.url))
        self.poll_forever()

    @work(exclusive=True, group="poll")
    async def poll_forever(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.poll_interval)

    async def poll_once(self) -> None:
        if self.server is not None:
            self.query_one(LogPane).append(self.server.new_log_lines())
            if self.server.returncode() is not None:
                self.exit()
                return
        try:
            reading = await self.client.read()
        except ServerUnreachableError as exc:
            self._show_unreachable(str(exc))
            return
        self.polls += 1
        self.status = reading.status
        self.figures = derive(self.window.add(reading), reading)
        self.history.add(self.figures)
        self._show(reading)

    def _show(self, reading: Reading) -> None:
        self._show_title()
        self.query_one("#startup", Static).update(startup_text(reading.status, self.url))
        self.query_one(Overview).show(self.figures, self.history)
        self.query_one(RequestsPane).show(reading.status.get("requests") or [])
        if self.server is None:
            self.query_one(LogPane).append(self._new_remote_logs(reading.status))

    def _show_unreachable(self, error: str) -> None:
        # Before the owned server listens, a refused connection is simply "still starting".
        note = "" if self.server is not None and self.status is None else f"({error})"
        self.query_one("#startup", Static).update(startup_text(None, self.url, note))

    def _new_remote_logs(self, status: dict[str, Any]) -> list[str]:
        """Lines of /status recent_logs not shown yet; the list is a ring, so match the overlap."""
        current = [str(line) for line in status.get("recent_logs") or []]
        previous = self._seen_logs
        self._seen_logs = current
        for overlap in range(min(len(previous), len(current)), 0, -1):
            if previous[-overlap:] == current[:overlap]:
                return current[overlap:]
        return current

    def _show_title(self) -> None:
        status = self.status or {}
        state = "[green]ready[/]" if status.get("ready") else "loading" if status else "connecting"
        owner = "serving" if self.server is not None else "attached to"
        uptime = status.get("uptime_s")
        up = f" · up {uptime:.0f} s" if isinstance(uptime, (int, float)) else ""
        model = escape(str(status.get("model") or "?"))
        self.query_one("#title", Static).update(
            f"[b]met[/b] · {owner} {self.url} · {model} · {state}{up} · ? help"
        )

    def in_flight(self) -> int:
        return self.figures.running + self.figures.waiting

    def action_show_pane(self, pane: str) -> None:
        self.query_one(TabbedContent).active = pane
        if pane == "chat":
            self.query_one("#chat-input", Input).focus()
        else:
            self.set_focus(None)

    def action_cycle_pane(self, step: int) -> None:
        current = PANES.index(self.query_one(TabbedContent).active or "overview")
        self.action_show_pane(PANES[(current + step) % len(PANES)])

    def action_filter_logs(self) -> None:
        self.action_show_pane("logs")
        self.query_one("#log-filter", Input).focus()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_leave_input(self) -> None:
        self.set_focus(None)

    def action_request_quit(self) -> None:
        busy = self.in_flight()
        if not busy:
            self.exit()
            return
        question = f"{busy} request(s) in flight."
        if self.server is not None:
            question += " Quitting drains them, then stops the server."
        self.push_screen(ConfirmQuit(question), self._quit_if_confirmed)

    def _quit_if_confirmed(self, confirmed: bool | None) -> None:
        if confirmed:
            self.exit()

    def action_quit_now(self) -> None:
        self.exit()

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "chat-input" or not event.value.strip():
            return
        text = event.value.strip()
        event.input.value = ""
        pane = self.query_one(ChatPane)
        if text == "/reset":
            self.chat_history.clear()
            pane.clear()
            return
        self.chat_history.append({"role": "user", "content": text})
        pane.add_message("user", text)
        self.stream_reply()

    @work(exclusive=True, group="chat")
    async def stream_reply(self) -> None:
        pane = self.query_one(ChatPane)
        message = pane.add_message("assistant", "…")
        reply = ""
        try:
            model = (self.status or {}).get("model") or "default"
            async for piece in self.client.chat(model, self.chat_history, self.chat_max_tokens):
                reply += piece
                pane.update_message(message, "assistant", reply)
        except (ServerUnreachableError, httpx.HTTPError, ValueError) as exc:
            pane.update_message(message, "error", f"{type(exc).__name__}: {exc}")
            self.chat_history.pop()
            return
        self.chat_history.append({"role": "assistant", "content": reply})

    async def on_unmount(self) -> None:
        await self.client.close()


def run_dashboard(url: str, server: ServerProcess | None = None) -> None:
    """Run the dashboard in the foreground until the user quits or the owned server exits."""
    Dashboard(url, server=server).run()
