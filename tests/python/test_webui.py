"""The chat page at `/` in a real browser: headless Chromium driven by Selenium against a real
server with an API key (the page asks for it), streaming, the stop button, a screenshot."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from server_harness import ServerProcess, start_server

from met.config import EngineConfig
from met.engine.async_engine import AsyncEngine
from met.server.app import create_app
from met.server.settings import ServerSettings

KEY = "webui-key"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.mark.parametrize("no_webui", [False, True])
def test_the_page_ships_in_the_package_and_no_webui_turns_it_off(no_webui: bool) -> None:
    settings = ServerSettings(api_key=KEY, no_webui=no_webui)
    client = TestClient(create_app(AsyncEngine(EngineConfig()), settings))
    page, script = client.get("/"), client.get("/webui/chat.js")
    if no_webui:
        assert page.status_code == script.status_code == 404
        return
    # The page and its files load without the key; the API it calls still needs it.
    assert page.status_code == 200 and "webui/chat.js" in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    assert script.status_code == 200 and "v1/chat/completions" in script.text
    assert client.get("/webui/chat.css").status_code == 200
    assert client.get("/v1/models").status_code == 401


@pytest.fixture(scope="module")
def server():
    proc = start_server("--max-model-len", "1024", api_key=KEY)
    yield proc
    assert proc.stop() == 0


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("no chromium/chromedriver here (scripts/setup.sh installs them when root)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1200,800",
    ):
        options.add_argument(flag)
    # The driver's path is given, so Selenium never tries to download one.
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    where = os.environ.get("MET_TEST_ARTIFACTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        return Path(where)
    return tmp_path_factory.mktemp("webui-artifacts")


def _wait(condition, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _set(driver, element_id: str, value: str) -> None:
    field = driver.find_element("id", element_id)
    field.clear()
    field.send_keys(value)


def _answers(driver) -> list:
    return driver.find_elements("css selector", ".message.assistant")


def _ask(driver, text: str) -> object:
    before = len(_answers(driver))
    _set(driver, "prompt", text)
    driver.find_element("id", "send").click()
    return _wait(lambda: len(_answers(driver)) > before and _answers(driver)[-1], what="an answer")


def _stats(answer) -> object | None:
    found = answer.find_elements("css selector", ".stats")
    return found[0] if found else None


@pytest.mark.slow
def test_chat_in_a_real_browser(server: ServerProcess, browser, artifacts: Path) -> None:
    browser.get(server.url + "/")
    key_form = browser.find_element("id", "key-form")
    _wait(key_form.is_displayed, what="the API key form")
    _set(browser, "api-key", KEY)
    browser.find_element("id", "key-save").click()
    model = _wait(lambda: browser.find_element("id", "model").text, what="the model name")
    assert model == server.openai().models.list().data[0].id and not key_form.is_displayed()

    _set(browser, "system", "You are a helpful assistant.")
    _set(browser, "temperature", "0")
    _set(browser, "max-tokens", "24")
    answer = _ask(browser, "Name three primary colors.")
    stats = _wait(lambda: _stats(answer), what="the first answer to finish")
    text = answer.find_element("css selector", ".body").text
    assert text.strip(), "the answer is empty"
    assert int(stats.get_attribute("data-tokens")) > 0
    assert float(stats.get_attribute("data-ttft-ms")) > 0
    assert float(stats.get_attribute("data-tokens-per-s")) > 0

    # A long answer: its text grows while it streams, then Stop ends it and the server frees it.
    _set(browser, "max-tokens", "800")
    # Greedy, the default model writes this story up to max_tokens (800 tokens, seconds even on a
    # quiet machine), so Stop always lands while it streams; counting to 500 ends after 13 tokens.
    answer = _ask(browser, "Write a very long story about a dragon, at least two thousand words.")
    body = answer.find_element("css selector", ".body")
    first = _wait(lambda: body.text.strip() and body.text, what="streamed text")
    _wait(lambda: len(body.text) > len(first) and _stats(answer) is None, what="the text to grow")
    browser.find_element("id", "stop").click()
    stats = _wait(lambda: _stats(answer), timeout=10, what="the stopped answer")
    assert "stopped" in stats.text and int(stats.get_attribute("data-tokens")) < 800
    with httpx.Client(base_url=server.url, headers=server.headers(), timeout=10) as http:
        state = _wait(lambda: _idle(http), timeout=5, what="the server to free the request")
    assert state["kv_blocks_used"] == 0
    stopped_text = body.text
    time.sleep(0.5)
    assert body.text == stopped_text  # nothing arrives after Stop

    # Everything the page loaded came from this server.
    urls = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    assert urls and all(u.startswith(server.url + "/") for u in urls), urls
    shot = artifacts / "webui-chat.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")


def _idle(http: httpx.Client) -> dict | None:
    status = http.get("/status").json()
    stats = status["stats"]
    if stats["running"] or stats["waiting"] or stats["kv_blocks_used"]:
        return None
    if not any(r["state"] == "disconnected" for r in status["requests"]):
        return None
    return stats
