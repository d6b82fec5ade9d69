"""Shared by the agent-API tests: a real server (any model name, an API key), the anthropic and
openai clients, and the SSE frames as they arrive on the wire."""

from __future__ import annotations

import json

import anthropic
import openai
from server_harness import ServerProcess, start_server

KEY = "sk-agent-test"
# The anthropic SDK no longer takes sampling fields; Messages requests may still carry them.
GREEDY = {"temperature": 0}


def agent_server() -> ServerProcess:
    return start_server("--max-model-len", "1024", "--served-model-name", "*", api_key=KEY)


def claude_client(server: ServerProcess) -> anthropic.Anthropic:
    # The anthropic client sends the key as x-api-key; the openai one as a bearer token.
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)


def openai_client(server: ServerProcess) -> openai.OpenAI:
    return server.openai(timeout=120)


def sse(lines: list[str]) -> list[tuple[str, dict]]:
    """(event name, data) of each frame."""
    events, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((name, json.loads(line.removeprefix("data: "))))
    return events


def wire(server: ServerProcess, path: str, body: dict) -> list[tuple[str, dict]]:
    with server.http(timeout=120) as http, http.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        return sse(list(response.iter_lines()))
