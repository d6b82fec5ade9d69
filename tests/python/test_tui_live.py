"""The dashboard attached to a live `met serve` under load (slow: loads the default model)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import httpx
import pexpect
import pytest
from met_cli_support import free_port, live_server, met_env
from textual.widgets import DataTable, RichLog, Static, TabbedContent

from met.tui import Dashboard
from met.tui.screens import ConfirmQuit, HelpScreen

pytestmark = pytest.mark.slow

# The committed snapshot (for review) is rewritten only on request, so a test run leaves the
# tree clean: MET_UPDATE_SNAPSHOTS=1 python -m pytest tests/python/test_tui_live.py
SNAPSHOT_DIR = Path(__file__).resolve().parents[1] / "snapshots"


@pytest.fixture(scope="module")
def server_url(default_model_path: Path):
    with live_server(default_model_path, free_port()) as url:
        yield url


async def _load(url: str, count: int, max_tokens: int) -> None:
    """A few concurrent streaming chats of exactly max_tokens tokens, read to the end."""

    async def one(index: int) -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"Count from {index} upwards."}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            async for _ in response.aiter_lines():
                pass

    async with httpx.AsyncClient(timeout=300) as client:
        model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
        await asyncio.gather(*(one(i) for i in range(count)))


def test_dashboard_follows_a_live_server(server_url: str, tmp_path: Path) -> None:
    folder = SNAPSHOT_DIR if os.environ.get("MET_UPDATE_SNAPSHOTS") else tmp_path
    snapshot = folder / "dashboard.svg"

    async def drive() -> None:
        app = Dashboard(server_url, poll_interval=0.5, chat_max_tokens=8)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(1.0)
            assert "READY" in str(app.query_one("#startup", Static).render())
            generated_before = app.figures.generated_total
            # Long enough (ignore_eos) that the 0.5 s polls see it in flight even when decoding
            # runs at hundreds of tokens/s.
            load = asyncio.create_task(_load(server_url, count=3, max_tokens=400))
            busiest, fastest, rows = 0, 0.0, 0
            while not load.done():
                await pilot.pause(0.5)
                busiest = max(busiest, app.in_flight())
                fastest = max(fastest, app.figures.tokens_per_s)
                rows = max(rows, app.query_one("#requests-table", DataTable).row_count)
                if app.in_flight() and app.figures.tokens_per_s:
                    # The last busy moment shows the most chart history.
                    app.save_screenshot(snapshot.name, str(snapshot.parent))
            await load
            await pilot.pause(1.5)
            assert busiest > 0 and fastest > 0 and rows > 0
            assert app.figures.generated_total - generated_before >= 3
            assert max(app.history.ttft_ms) > 0
            assert max(app.history.tokens_per_s) > 0

            await pilot.press("2")
            assert app.query_one(TabbedContent).active == "requests"
            await pilot.press("3")
            assert app.query_one("#log", RichLog).lines  # the server's recent_logs
            await pilot.press("tab")
            assert app.query_one(TabbedContent).active == "chat"
            await pilot.press(*"Say hi", "enter")
            await pilot.pause(0.2)
            for _ in range(120):
                if len(app.chat_history) == 2:
                    break
                await pilot.pause(0.5)
            assert app.chat_history[-1]["role"] == "assistant"
            await pilot.press("escape", "question_mark")
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape", "1")
            # Polling stopped, a request "in flight" stays in flight: quitting must ask first.
            app.workers.cancel_group(app, "poll")
            app.figures.running = 1
            await pilot.press("q")
            assert isinstance(app.screen, ConfirmQuit)
            await pilot.press("y")
        assert app.return_code == 0

    snapshot.unlink(missing_ok=True)
    asyncio.run(drive())
    assert snapshot.read_text().startswith("<svg")


def test_met_serve_in_a_terminal_opens_the_dashboard_and_q_stops_the_server(
    default_model_path: Path,
) -> None:
    port = free_port()
    env = met_env()
    del env["MET_NO_TUI"]
    child = pexpect.spawn(
        sys.executable,
        ["-m", "met.cli", "serve", "--port", str(port), "--model", str(default_model_path)],
        env=env,
        encoding="utf-8",
        dimensions=(40, 120),
        timeout=300,
    )
    child.expect_exact("READY")
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
    child.send("q")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
