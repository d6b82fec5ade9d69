"""The load generator behind `met bench`: streaming chat requests against an OpenAI-style URL."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from met.commands.bench_stats import RequestResult

# Common short words: each is about one token in the usual BPE vocabularies, so a prompt of N
# words is close to N tokens; the server's usage figures give the exact count.
_WORD_TEXT = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea"
)
WORDS = tuple(_WORD_TEXT.split())


@dataclass
class LoadPlan:
    base_url: str
    model: str
    prompts: list[str]
    output_len: int
    concurrency: int | None
    request_rate: float | None
    num_requests: int | None
    duration: float | None
    seed: int = 0
    timeout: float = 600.0


def synthetic_prompts(count: int, prompt_len: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    # A distinct opening per prompt keeps the prefix cache from serving whole prompts.
    return [
        f"{i} " + " ".join(rng.choice(WORDS) for _ in range(max(prompt_len - 1, 1)))
        for i in range(count)
    ]


async def stream_one(client: httpx.AsyncClient, plan: LoadPlan, prompt: str) -> RequestResult:
    body = {
        "model": plan.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": plan.output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    result = RequestResult(ok=False, start=start, end=start)
    last_token = None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:200]
                result.error = f"HTTP {response.status_code}: {text}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.endswith("[DONE]"):
                    continue
                chunk = json.loads(line[5:])
                now = time.perf_counter()
                if _has_content(chunk):
                    if last_token is None:
                        result.ttft = now - start
                    else:
                        result.token_gaps.append(now - last_token)
                    last_token = now
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"].get("prompt_tokens", 0)
                    result.completion_tokens = chunk["usage"].get("completion_tokens", 0)
        result.ok = True
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.end = time.perf_counter()
    return result


def _has_content(chunk: dict) -> bool:
    return any((choice.get("delta") or {}).get("content") for choice in chunk.get("choices", []))


async def run_load(
    plan: LoadPlan, on_result: Callable[[RequestResult], None]
) -> tuple[list[RequestResult], float]:
    """Send the plan's requests; returns every result and the wall time they took."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        base_url=plan.base_url, timeout=plan.timeout, limits=limits
    ) as client:
        results: list[RequestResult] = []

        async def fire(prompt: str) -> None:
            result = await stream_one(client, plan, prompt)
            results.append(result)
            on_result(result)

        start = time.perf_counter()
        await _schedule(plan, fire)
        return results, time.perf_counter() - start


async def _schedule(plan: LoadPlan, fire: Callable[[str], Awaitable[None]]) -> None:
    # The concurrency cap holds a slot per request in flight; the arrival process (Poisson at
    # --request-rate, else back-to-back) decides when the next request wants one.
    slots = asyncio.Semaphore(plan.concurrency or sys.maxsize)
    rng = random.Random(plan.seed)
    deadline = None if plan.duration is None else time.perf_counter() + plan.duration
    tasks = []

    async def guarded(prompt: str) -> None:
        try:
            await fire(prompt)
        finally:
            slots.release()

    for index in itertools.count():
        if plan.num_requests is not None and index >= plan.num_requests:
            break
        if plan.request_rate:
            await asyncio.sleep(rng.expovariate(plan.request_rate))
        await slots.acquire()
        if deadline is not None and time.perf_counter() >= deadline:
            slots.release()
            break
        tasks.append(asyncio.create_task(guarded(plan.prompts[index % len(plan.prompts)])))
    await asyncio.gather(*tasks)
