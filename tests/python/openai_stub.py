"""A tiny OpenAI-compatible stand-in, for testing argument handling and arithmetic only.

Acceptance tests hit the real met server; this one answers every chat with the same few words
so that counts and timings are known exactly.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPLY_WORDS = ["alpha ", "beta ", "gamma"]


class StubState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.generated = 0


class _Handler(BaseHTTPRequestHandler):
    state: StubState
    token_delay = 0.01

    def log_message(self, *args: object) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        if self.path == "/v1/models":
            self._json({"object": "list", "data": [{"id": "stub-model", "object": "model"}]})
        elif self.path == "/status":
            with self.state.lock:
                stats = {
                    "running": 0,
                    "waiting": 0,
                    "kv_blocks_used": 0,
                    "kv_blocks_total": 64,
                    "requests_total": self.state.requests,
                    "generated_tokens_total": self.state.generated,
                }
            self._json({"model": "stub-model", "ready": True, "stats": stats, "requests": []})
        else:
            self.send_error(404)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length))
        if self.path != "/v1/chat/completions" or not body.get("stream"):
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        words = REPLY_WORDS[: body.get("max_tokens", len(REPLY_WORDS))]
        for word in words:
            time.sleep(self.token_delay)
            self._event({"choices": [{"index": 0, "delta": {"content": word}}]})
        usage = {
            "prompt_tokens": 7,
            "completion_tokens": len(words),
            "total_tokens": 7 + len(words),
        }
        self._event({"choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")
        with self.state.lock:
            self.state.requests += 1
            self.state.generated += len(words)

    def _event(self, payload: dict) -> None:
        self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
        self.wfile.flush()

    def _json(self, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def start_stub() -> tuple[ThreadingHTTPServer, StubState]:
    state = StubState()
    handler = type("Handler", (_Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, state
