"""Overload gets 503 + Retry-After, timeouts cut requests short, SIGTERM drains and exits 0."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from server_harness import ServerProcess, start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small_server():
    proc = start_server("--max-num-seqs", "1", "--max-queue", "2")
    yield proc
    assert proc.stop() == 0


def test_overload_gives_503_with_retry_after(small_server: ServerProcess) -> None:
    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=small_server.url, timeout=120) as http:
            body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
            return await asyncio.gather(
                *[http.post("/v1/completions", json=body) for _ in range(10)]
            )

    responses = asyncio.run(main())
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 503]
    assert len(ok) + len(refused) == 10 and len(ok) >= 3 and refused
    for response in refused:
        assert int(response.headers["retry-after"]) >= 1
        assert response.json()["error"]["code"] == "queue_full"
    texts = [(r.json()["choices"][0]["text"], r.json()["usage"]) for r in ok]
    assert all(text == texts[0][0] for text, _ in texts), texts


def _assert_timeout_ends_with_length(server: ServerProcess) -> None:
    body = {"prompt": "Count:", "max_tokens": 3000, "ignore_eos": True, "temperature": 0}
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert response.status_code == 200
    out = response.json()
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] < 3000


def test_request_timeout_then_sigterm_drain_and_exit_zero() -> None:
    # One server for both: each start loads the model again.
    server = start_server("--shutdown-grace", "30", "--request-timeout", "3")
    first_chunk = threading.Event()
    lines: list[str] = []

    def stream() -> None:
        # Long enough to still be streaming after the signal and the 0.3 s below (~5 ms a token).
        body = {"prompt": "Tell me a story.", "max_tokens": 300, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                    first_chunk.set()

    try:
        _assert_timeout_ends_with_length(server)
        reader = threading.Thread(target=stream)
        reader.start()
        assert first_chunk.wait(60)
        server.signal()
        time.sleep(0.3)
        refused = httpx.post(server.url + "/v1/completions", json={"prompt": "x"}, timeout=10)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "shutting_down"
        assert httpx.get(server.url + "/health").status_code == 503
        reader.join(120)
        assert lines[-1] == "data: [DONE]"
        last = json.loads(lines[-2][len("data: ") :])
        assert last["choices"][0]["finish_reason"] == "length"
        assert server.proc.wait(60) == 0
    finally:
        server.stop()


def test_sigterm_after_the_grace_aborts_the_rest_and_exits_zero() -> None:
    server = start_server("--shutdown-grace", "1")
    body = {"prompt": "Count:", "max_tokens": 2000, "ignore_eos": True}
    results: dict[str, object] = {}

    def whole() -> None:
        results["whole"] = httpx.post(server.url + "/v1/completions", json=body, timeout=120)

    def streamed() -> None:
        with httpx.stream(
            "POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=120
        ) as response:
            results["lines"] = [line for line in response.iter_lines() if line]

    threads = [threading.Thread(target=whole), threading.Thread(target=streamed)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(2)
        server.signal()
        for thread in threads:
            thread.join(120)
        response = results["whole"]
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "shutting_down"
        lines = results["lines"]
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][len("data: ") :])["error"]["code"] == "shutting_down"
        assert server.proc.wait(30) == 0
    finally:
        server.stop()
