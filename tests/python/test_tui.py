"""The dashboard's arithmetic, and its keys driven headless against the OpenAI stub."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from openai_stub import start_stub
from textual.widgets import TabbedContent

from met.tui import Dashboard
from met.tui.metrics import (
    ITL_METRIC,
    TTFT_METRIC,
    Reading,
    ReadingWindow,
    derive,
    parse_prometheus,
)
from met.tui.panes import LogPane, startup_text
from met.tui.screens import ConfirmQuit, HelpScreen

PROMETHEUS = f"""# HELP met_requests_total Requests.
# TYPE met_requests_total counter
met_requests_total{{code="200",model="m"}} 4
met_requests_total{{code="503",model="m"}} 1
{TTFT_METRIC}_bucket{{le="0.1"}} 3
{TTFT_METRIC}_sum 0.6
{TTFT_METRIC}_count 4
{ITL_METRIC}_sum 1.5
{ITL_METRIC}_count 30
met_kv_cache_usage_ratio 0.25
"""


def _reading(time: float, metrics: dict[str, float], **stats: float) -> Reading:
    return Reading(time=time, status={"stats": stats}, metrics=metrics)


def test_parse_prometheus_sums_label_sets_and_skips_buckets() -> None:
    values = parse_prometheus(PROMETHEUS)
    assert values["met_requests_total"] == 5
    assert values[f"{TTFT_METRIC}_count"] == 4
    assert f"{TTFT_METRIC}_bucket" not in values
    assert values["met_kv_cache_usage_ratio"] == 0.25


def test_derive_rates_and_latencies_from_deltas() -> None:
    before = _reading(
        10.0,
        {f"{TTFT_METRIC}_sum": 0.5, f"{TTFT_METRIC}_count": 2},
        requests_total=2,
        generated_tokens_total=100,
    )
    after = _reading(
        12.0,
        {f"{TTFT_METRIC}_sum": 0.9, f"{TTFT_METRIC}_count": 4},
        requests_total=6,
        generated_tokens_total=160,
        running=2,
        waiting=1,
        kv_blocks_used=8,
        kv_blocks_total=32,
    )
    figures = derive(before, after)
    assert figures.requests_per_s == 2.0
    assert figures.tokens_per_s == 30.0
    assert figures.ttft_ms == pytest.approx(200.0)
    assert figures.itl_ms is None  # no inter-token observations in the interval
    assert (figures.running, figures.waiting, figures.kv_percent) == (2, 1, 25.0)


def test_derive_treats_a_counter_reset_as_zero() -> None:
    figures = derive(_reading(0.0, {}, requests_total=50), _reading(1.0, {}, requests_total=3))
    assert figures.requests_per_s == 0.0


def test_reading_window_compares_with_a_reading_a_window_old() -> None:
    window = ReadingWindow(seconds=5.0)
    readings = [_reading(float(t), {}) for t in range(10)]
    baselines = [window.add(reading) for reading in readings]
    assert baselines[0] is None
    assert baselines[3] is readings[0]  # younger than the window: the oldest there is
    assert baselines[9] is readings[4]  # exactly a window old


def test_startup_panel_shows_loading_then_ready() -> None:
    loading = {
        "ready": False,
        "loading": {
            "stage": "weights",
            "bytes_done": 512 * 1024,
            "bytes_total": 1024 * 1024,
            "bytes_per_s": 2048.0,
        },
    }
    assert "50%" in startup_text(loading, "http://x")
    assert "2.0 KiB/s" in startup_text(loading, "http://x")
    ready = {
        "ready": True,
        "model": "tiny",
        "address": "http://127.0.0.1:1",
        "info": {
            "dtype": "float32",
            "device": "cpu",
            "kv_blocks_total": 64,
            "block_size": 16,
            "max_num_seqs": 4,
        },
    }
    text = startup_text(ready, "http://x")
    assert "READY" in text and "float32" in text and "64 blocks" in text
    assert "models:" not in text
    ready["models"] = [
        {"name": "tiny", "state": "loaded", "in_flight": 2},
        {"name": "coder", "state": "unloaded", "in_flight": 0},
    ]
    assert "models: tiny loaded (2 requests), coder unloaded" in startup_text(ready, "http://x")
    assert "STARTING" in startup_text(None, "http://x")


def test_keys_switch_panes_help_and_quit_against_the_stub() -> None:
    server, state = start_stub()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    async def drive() -> None:
        app = Dashboard(url, poll_interval=0.1)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.3)
            tabs = app.query_one(TabbedContent)
            for key, pane in (("2", "requests"), ("3", "logs"), ("4", "chat")):
                await pilot.press(key)
                assert tabs.active == pane
            # The chat pane focuses its text box, where digits are text; Esc leaves it.
            await pilot.press("escape", "1")
            assert tabs.active == "overview"
            await pilot.press("tab")
            assert tabs.active == "requests"
            await pilot.press("shift+tab", "shift+tab")
            assert tabs.active == "chat"
            await pilot.press(*"hi", "enter")  # the chat box has focus on the chat pane
            await pilot.pause(0.5)
            assert app.chat_history[-1] == {"role": "assistant", "content": "alpha beta gamma"}
            await pilot.press("escape", "slash", *"POST")
            assert tabs.active == "logs"
            assert app.query_one(LogPane).filter == "post"
            await pilot.press("escape", "question_mark")
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("space")
            assert not isinstance(app.screen, HelpScreen)
            async with httpx.AsyncClient() as client:
                body = {"stream": True, "max_tokens": 3, "messages": []}
                await client.post(f"{url}/v1/chat/completions", json=body)
            await pilot.pause(0.3)
            assert app.figures.requests_total == state.requests == 2
            await pilot.press("q")
        assert app.return_code == 0

    try:
        asyncio.run(drive())
    finally:
        server.shutdown()


def test_quit_asks_first_while_requests_are_in_flight() -> None:
    server, _ = start_stub()

    async def drive() -> None:
        app = Dashboard(f"http://127.0.0.1:{server.server_address[1]}", poll_interval=60)
        async with app.run_test() as pilot:
            app.figures.running = 2
            await pilot.press("q")
            assert isinstance(app.screen, ConfirmQuit)
            await pilot.press("n")
            assert not isinstance(app.screen, ConfirmQuit)
            await pilot.press("q", "y")
        assert app.return_code == 0

    try:
        asyncio.run(drive())
    finally:
        server.shutdown()
