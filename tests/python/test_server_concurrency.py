"""Many clients at once: batching does not change greedy output; disconnects free the KV cache."""

from __future__ import annotations

import asyncio
import time

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


async def _leave_early(http: httpx.AsyncClient, i: int) -> None:
    body = {
        "prompt": f"Count slowly from {i}:",
        "max_tokens": 200,
        "temperature": 0,
        "ignore_eos": True,
        "stream": i % 2 == 0,  # half stream, half wait for a whole response
    }
    try:
        async with asyncio.timeout(0.5):
            async with http.stream("POST", "/v1/completions", json=body) as response:
                async for _ in response.aiter_bytes():
                    pass
    except TimeoutError:
        pass  # leaving the context closes the connection: the client is gone


def test_disconnect_burst_frees_every_kv_block(server: ServerProcess) -> None:
    async def main() -> None:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=60) as http:
            await asyncio.gather(*[_leave_early(http, i) for i in range(50)])

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
        status = http.get("/status").json()
        assert any(r["state"] == "disconnected" for r in status["requests"])
        assert 'code="499"' in http.get("/metrics").text
