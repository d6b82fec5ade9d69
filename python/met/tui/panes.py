"""The dashboard's panes: overview, requests, logs and chat."""

from __future__ import annotations

from collections import deque
from typing import Any

from rich.markup import escape
from textual.app import ComposeResult
from textual.containers import Grid, Vertical, VerticalScroll
from textual.widgets import DataTable, Input, RichLog, Sparkline, Static

from met.commands.common import human_bytes
from met.tui.metrics import HISTORY_POINTS, RATE_WINDOW_S, Figures, History

CHARTS = (
    ("tokens_per_s", "generated tokens/s"),
    ("requests_per_s", "requests/s"),
    ("ttft_ms", "time to first token, ms"),
    ("itl_ms", "inter-token latency, ms"),
    ("kv_percent", "KV cache used, %"),
    ("in_flight", "requests in flight"),
)


def startup_text(status: dict[str, Any] | None, url: str, note: str = "") -> str:
    """The start-up panel: loading progress until the server is ready, then what it serves."""
    if status is None:
        return f"[b]STARTING[/b]  waiting for the server at {url}…  {note}"
    if status.get("load_error"):
        return f"[b red]FAILED[/b red]  {escape(str(status['load_error']))}"
    if status.get("draining"):
        return "[b yellow]DRAINING[/b yellow]  finishing the requests in flight, then stopping"
    if not status.get("ready"):
        return "[b yellow]LOADING[/b yellow]  " + _loading_progress(status.get("loading"))
    info = status.get("info") or {}
    kv_total = info.get("kv_blocks_total", "?")
    block = info.get("block_size", "?")
    return (
        f"[b green]READY[/b green]  {status.get('model', '?')}  "
        f"dtype {info.get('dtype', '?')}  device {info.get('device', '?')}  "
        f"KV {kv_total} blocks × {block} tokens  max seqs {info.get('max_num_seqs', '?')}  "
        f"at {status.get('address') or url}"
    ) + _models_line(status.get("models") or [])


def _models_line(models: list[dict[str, Any]]) -> str:
    """With several models: each one's state, and its requests while it has some."""
    if len(models) < 2:
        return ""
    cells = []
    for model in models:
        busy = f" ({model['in_flight']} requests)" if model.get("in_flight") else ""
        cells.append(f"{escape(str(model.get('name') or '?'))} {model.get('state', '?')}{busy}")
    return "\nmodels: " + ", ".join(cells)


def _loading_progress(loading: Any) -> str:
    if not isinstance(loading, dict):
        return "loading…"
    stage = escape(str(loading.get("stage") or "loading"))
    done, total = loading.get("bytes_done") or 0, loading.get("bytes_total") or 0
    if not total:
        return f"{stage}…"
    speed = loading.get("bytes_per_s")
    text = f"{stage}  {human_bytes(done)} / {human_bytes(total)} ({100 * done / total:.0f}%)"
    return text + (f"  {human_bytes(speed)}/s" if speed else "")


def figures_text(figures: Figures) -> str:
    ttft = "–" if figures.ttft_ms is None else f"{figures.ttft_ms:.0f} ms"
    itl = "–" if figures.itl_ms is None else f"{figures.itl_ms:.1f} ms"
    return (
        f"running [b]{figures.running}[/b]  waiting [b]{figures.waiting}[/b]   "
        f"KV [b]{figures.kv_used}/{figures.kv_total}[/b] ({figures.kv_percent:.0f}%)   "
        f"prefix hits [b]{100 * figures.prefix_hit_rate:.0f}%[/b]\n"
        f"[b]{figures.requests_per_s:.2f}[/b] req/s   [b]{figures.tokens_per_s:.1f}[/b] tok/s   "
        f"prompt [b]{figures.prompt_tokens_per_s:.0f}[/b] tok/s   TTFT [b]{ttft}[/b]   "
        f"ITL [b]{itl}[/b]   (last {RATE_WINDOW_S:.0f} s)\n"
        f"requests {figures.requests_total}   generated tokens {figures.generated_total}   "
        f"errors {figures.errors_total}"
    )


class Overview(Vertical):
    def compose(self) -> ComposeResult:
        yield Static("", id="startup")
        yield Static("", id="figures")
        with Grid(id="charts"):
            for key, label in CHARTS:
                with Vertical(classes="chart"):
                    yield Static(label, id=f"label-{key}", classes="chart-label")
                    yield Sparkline([], id=f"chart-{key}")

    def show(self, figures: Figures, history: History) -> None:
        self.query_one("#figures", Static).update(figures_text(figures))
        for key, label in CHARTS:
            series = list(getattr(history, key))
            latest = f"  [b]{series[-1]:.1f}[/b]" if series else ""
            self.query_one(f"#label-{key}", Static).update(f"{label}{latest}")
            # Zeros before the first reading keep the time axis fixed: new points enter at the
            # right and the chart scrolls, instead of a few points stretched over the width.
            padding = [0.0] * (HISTORY_POINTS - len(series))
            self.query_one(f"#chart-{key}", Sparkline).data = padding + series


class RequestsPane(Vertical):
    COLUMNS = ("id", "state", "prompt tokens", "generated", "tokens/s", "age, s")

    def compose(self) -> ComposeResult:
        yield DataTable(id="requests-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(*self.COLUMNS)

    def show(self, requests: list[dict[str, Any]]) -> None:
        table = self.query_one(DataTable)
        table.clear()
        for request in requests:
            table.add_row(
                str(request.get("id", "")),
                str(request.get("state", "")),
                str(request.get("prompt_tokens", 0)),
                str(request.get("generated_tokens", 0)),
                f"{float(request.get('tokens_per_s') or 0):.1f}",
                f"{float(request.get('age_s') or 0):.1f}",
            )


class LogPane(Vertical):
    KEEP = 5000

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lines: deque[str] = deque(maxlen=self.KEEP)
        self.filter = ""

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter logs (Esc leaves the box)", id="log-filter")
        yield RichLog(id="log", wrap=False, markup=False, max_lines=self.KEEP)

    def append(self, lines: list[str]) -> None:
        log = self.query_one(RichLog)
        for line in lines:
            self.lines.append(line)
            if self.filter in line.lower():
                log.write(line)

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id != "log-filter":
            return
        self.filter = event.value.lower()
        log = self.query_one(RichLog)
        log.clear()
        for line in self.lines:
            if self.filter in line.lower():
                log.write(line)


class ChatPane(Vertical):
    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="transcript")
        yield Input(placeholder="message the served model; /reset clears", id="chat-input")

    def add_message(self, role: str, text: str) -> Static:
        message = Static(_message_markup(role, text), classes=f"message {role}")
        transcript = self.query_one("#transcript", VerticalScroll)
        transcript.mount(message)
        transcript.scroll_end(animate=False)
        return message

    def update_message(self, message: Static, role: str, text: str) -> None:
        message.update(_message_markup(role, text))
        self.query_one("#transcript", VerticalScroll).scroll_end(animate=False)

    def clear(self) -> None:
        self.query_one("#transcript", VerticalScroll).remove_children()


def _message_markup(role: str, text: str) -> str:
    colour = "cyan" if role == "user" else "green" if role == "assistant" else "red"
    return f"[b {colour}]{role}[/b {colour}] {escape(text)}"
