"""Many clients at once: batching does not change greedy output; disconnects free the KV cache."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_harness import ServerProcess, start_server

pytestmark = pytest.mark.slow

PROMPTS = [
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "What is the opposite of hot?",
    "Say hello in French.",
]


@pytest.fixture(scope="module")
def server():
    proc = start_server("--max-model-len", "512")
    yield proc
    assert proc.stop() == 0


async def _stream_text(client, model: str, prompt: str) -> str:
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=16,
        temperature=0,
        stream=True,
    )
    return "".join([chunk.choices[0].delta.content or "" async for chunk in stream])


def test_concurrent_greedy_streams_match_solo_runs(server: ServerProcess) -> None:
    async def main() -> tuple[list[str], list[str]]:
        client = server.async_openai(timeout=300)
        model = (await client.models.list()).data[0].id
        solo = [await _stream_text(client, model, p) for p in PROMPTS]
        runs = [_stream_text(client, model, PROMPTS[i % 4]) for i in range(16)]
        together = await asyncio.gather(*runs)
        await client.close()
        return solo, together

    solo, together = asyncio.run(main())
    assert all(solo)
    assert together == [solo[i % 4] for i in range(16)]


async def _stay_until_cancelled(http: httpx.AsyncClient, i: int) -> None:
    body = {
        "prompt": f"Count slowly from {i}:",
        "max_tokens": 400,
        "temperature": 0,
        "ignore_eos": True,
        "stream": i % 2 == 0,  # half stream, half wait for a whole response
    }
    async with http.stream("POST", "/v1/completions", json=body) as response:
        async for _ in response.aiter_bytes():
            pass


async def _in_flight(http: httpx.AsyncClient) -> int:
    requests = (await http.get("/status")).json()["requests"]
    return sum(r["state"] in ("waiting", "running") for r in requests)


def test_disconnect_burst_frees_every_kv_block(server: ServerProcess) -> None:
    async def main() -> None:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=60) as http:
            clients = [asyncio.create_task(_stay_until_cancelled(http, i)) for i in range(50)]
            # Leave only once the server holds every request, so that each exit is a disconnect
            # of a request in flight, however slow the machine is to accept fifty at once.
            deadline = time.monotonic() + 60
            while await _in_flight(http) < 50:
                assert time.monotonic() < deadline and not any(c.done() for c in clients)
                await asyncio.sleep(0.05)
            for client in clients:
                client.cancel()  # leaving the stream's context closes the connection
            await asyncio.gather(*clients, return_exceptions=True)

    asyncio.run(main())
    deadline = time.monotonic() + 3.0
    with server.http() as http:
        while True:
            stats = http.get("/status").json()["stats"]
            if stats["kv_blocks_used"] == stats["running"] == stats["waiting"] == 0:
                break
            assert time.monotonic() < deadline, f"still busy after the clients left: {stats}"
            time.sleep(0.1)
        started = time.monotonic()
        response = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 8})
        assert response.status_code == 200 and time.monotonic() - started < 10
        states = [r["state"] for r in http.get("/status").json()["requests"]]
        assert states.count("disconnected") >= 49  # the burst, but for one pushed out by "Hi"
        assert 'code="499"' in http.get("/metrics").text


def _wait_idle(http: httpx.Client, seconds: float = 3.0) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        stats = http.get("/status").json()["stats"]
        if stats["kv_blocks_used"] == stats["running"] == stats["waiting"] == 0:
            return stats
        assert time.monotonic() < deadline, f"still busy: {stats}"
        time.sleep(0.05)


def test_cancel_by_id_ends_the_stream_with_its_usage(server: ServerProcess) -> None:
    client = server.openai()
    stream = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": "Count from one to a thousand."}],
        max_tokens=400,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = iter(stream)
    first = next(c for c in chunks if c.choices and c.choices[0].delta.content)
    assert first.id.startswith("chatcmpl-")
    with server.http() as http:
        answer = http.post(f"/v1/requests/{first.id}/cancel")
        assert answer.status_code == 200 and answer.json()["cancelled"] is True
        cancelled_at = time.monotonic()
        rest = list(chunks)
        assert time.monotonic() - cancelled_at < 5
        reasons = [c.choices[0].finish_reason for c in rest if c.choices]
        assert reasons[-1] == "stop"
        usage = rest[-1].usage
        assert 0 < usage.completion_tokens < 400
        _wait_idle(http)
        records = {r["id"]: r for r in http.get("/status").json()["requests"]}
        assert records[first.id]["state"] == "cancelled"
        assert http.post(f"/v1/requests/{first.id}/cancel").status_code == 404  # it is over


def test_cancel_by_id_ends_a_blocking_completion(server: ServerProcess) -> None:
    body = {"prompt": "Count slowly:", "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    with server.http() as http, ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, server.url + "/v1/completions", json=body, timeout=60)
        deadline = time.monotonic() + 30
        running: list[dict] = []
        while not running:
            assert time.monotonic() < deadline and not pending.done()
            requests = http.get("/status").json()["requests"]
            running = [r for r in requests if r["state"] == "running"]
            time.sleep(0.05)
        request_id = running[0]["id"]
        assert request_id.startswith("cmpl-")
        assert http.post(f"/requests/{request_id}/cancel").status_code == 200  # no /v1 too
        out = pending.result(timeout=10).json()
        assert out["id"] == request_id and out["choices"][0]["finish_reason"] == "stop"
        assert 0 < out["usage"]["completion_tokens"] < 400
        _wait_idle(http)


def test_cancel_an_unknown_id_is_a_404(server: ServerProcess) -> None:
    with server.http() as http:
        response = http.post("/v1/requests/chatcmpl-nosuchrequest/cancel")
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "request_not_found" and error["param"] == "request_id"
