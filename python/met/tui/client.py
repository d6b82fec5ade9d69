"""The dashboard's view of a server: /status and /metrics over HTTP, so it works remotely too."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import httpx

from met.tui.metrics import Reading, parse_prometheus


class ServerUnreachableError(Exception):
    pass


class StatusClient:
    def __init__(self, base_url: str, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout)

    async def read(self) -> Reading:
        try:
            status, metrics = await asyncio.gather(
                self.http.get("/status"), self.http.get("/metrics")
            )
        except httpx.HTTPError as exc:
            raise ServerUnreachableError(f"{self.base_url}: {exc}") from exc
        if status.status_code != 200:
            code = status.status_code
            raise ServerUnreachableError(f"{self.base_url}/status answered HTTP {code}")
        values = parse_prometheus(metrics.text) if metrics.status_code == 200 else {}
        return Reading(time=time.monotonic(), status=status.json(), metrics=values)

    async def chat(
        self, model: str, messages: list[dict[str, str]], max_tokens: int
    ) -> AsyncIterator[str]:
        """Stream the assistant's reply text piece by piece."""
        body = {"model": model, "messages": messages, "stream": True, "max_tokens": max_tokens}
        async with self.http.stream(
            "POST", "/v1/chat/completions", json=body, timeout=None
        ) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")[:200]
                raise ServerUnreachableError(f"chat failed: HTTP {response.status_code}: {detail}")
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.endswith("[DONE]"):
                    continue
                for choice in json.loads(line[5:]).get("choices", []):
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        yield text

    async def close(self) -> None:
        await self.http.aclose()


def probe(base_url: str, timeout: float = 5.0) -> None:
    """Raise ServerUnreachableError unless something answers /status or /health at base_url."""
    try:
        response = httpx.get(f"{base_url.rstrip('/')}/status", timeout=timeout)
    except httpx.HTTPError as exc:
        raise ServerUnreachableError(f"cannot reach {base_url}: {exc}") from exc
    if response.status_code != 200:
        raise ServerUnreachableError(f"{base_url}/status answered HTTP {response.status_code}")
