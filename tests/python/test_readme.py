"""The README's first examples, run as written against a real server with the default model:
they must keep answering sensibly (a newcomer's first impression)."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import httpx
import pytest
from server_harness import REPO, ServerProcess, start_server

pytestmark = pytest.mark.slow

README = (REPO / "README.md").read_text()
README_URL = "http://127.0.0.1:8000"


def _block(language: str, containing: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", README, re.S)
    return next(b for b in blocks if containing in b)


@pytest.fixture(scope="module")
def server():
    proc = start_server()
    yield proc
    assert proc.stop() == 0


def test_the_curl_example_answers_sensibly(server: ServerProcess) -> None:
    command = _block("bash", "curl -s")
    assert README_URL + "/v1/chat/completions" in command
    body = json.loads(re.search(r"-d '(\{.*\})'", command).group(1))
    answer = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()
    text = answer["choices"][0]["message"]["content"]
    assert all(colour in text for colour in ("Red", "Blue", "Yellow")), text
    assert json.dumps(text) in command  # the answer the README shows, as the JSON carries it


def test_the_python_example_answers_sensibly(server: ServerProcess) -> None:
    code = _block("python", "from openai import OpenAI")
    assert README_URL + "/v1" in code
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code.replace(README_URL, server.url), {})  # the README's own code
    text = printed.getvalue()
    shown = re.search(r"^# (.*) \.\.\.$", code, re.M).group(1)
    assert text.startswith(shown) and "moon" in text, text


def test_the_ready_line_explains_the_capacity_plan(server: ServerProcess) -> None:
    log = Path(server.log_path).read_text()
    ready = next(line for line in log.splitlines() if " ready in " in line)
    assert f"on {server.url} (chat page at /)" in ready
    blocks, tokens = map(
        int, re.search(r"KV cache (\d+) blocks of 16 = (\d+) tokens", ready).groups()
    )
    assert tokens == 16 * blocks
    full = int(re.search(r"It holds (\d+) sequences of the full (\d+)-token context", ready)[1])
    assert full >= 1 and "at most 8 run at once" in ready and "--max-num-seqs sets" in ready
