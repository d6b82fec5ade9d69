"""The server's shared state: the engine, readiness, draining, metrics, request records, logs."""

from __future__ import annotations

import logging
import time
from typing import Any

from met.chat.setup import ChatSetup, resolve_setup
from met.server.errors import APIError
from met.server.metrics import ServerMetrics, hit_rate
from met.server.settings import ServerSettings
from met.server.tracking import RecentLogs, RequestTracker

log = logging.getLogger("met.server")


class LoadProgress:
    """Fed by the engine's progress callback (stage, done, total) from the loading thread."""

    def __init__(self) -> None:
        self.stage = "starting"
        self.done = 0
        self.total = 0

    def __call__(self, stage: str, done: int, total: int) -> None:
        self.stage, self.done, self.total = stage, done, total

    def view(self) -> dict[str, Any]:
        # The engine reports load steps, not bytes, so there are no bytes_* fields to show.
        return {"stage": self.stage, "done": self.done, "total": self.total}


class ServerState:
    def __init__(
        self,
        engine: Any,
        settings: ServerSettings,
        logs: RecentLogs | None = None,
        progress: LoadProgress | None = None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = ServerMetrics(self._engine_stats)
        self.tracker = RequestTracker()
        self.logs = logs or RecentLogs()
        self.progress = progress or LoadProgress()
        self.started_at = time.monotonic()
        self.draining = False
        self.load_error: str | None = None
        self.engine_dead = False
        self.generations: set[Any] = set()  # the in-flight Generation objects
        self._chat_setup: ChatSetup | None = None

    def _engine_stats(self) -> tuple[Any, bool]:
        ready = self.ready
        return (self.engine.stats() if ready else None), ready

    @property
    def ready(self) -> bool:
        return bool(self.engine.ready) and self.load_error is None and not self.engine_dead

    @property
    def served_model_names(self) -> list[str]:
        return list(self.settings.served_model_name or [self.engine.model_name])

    @property
    def served_model_name(self) -> str:
        """The name answers carry by default: the first served name that is not '*'."""
        names = [n for n in self.served_model_names if n != "*"]
        return names[0] if names else self.engine.model_name

    @property
    def chat_setup(self) -> ChatSetup:
        """The tool-call format and reasoning parser of the loaded model (decided once)."""
        if self._chat_setup is None:
            self._chat_setup = resolve_setup(
                self.engine.tokenizer.chat_template,
                self.settings.tool_call_parser,
                self.settings.reasoning_parser,
            )
        return self._chat_setup

    def require_ready(self) -> Any:
        """The engine, or a 503 while the model loads or the server drains."""
        if self.draining:
            raise APIError(503, "The server is shutting down", code="shutting_down")
        if self.engine_dead:
            raise APIError(
                503, "The engine stopped; the server must be restarted", code="engine_dead"
            )
        if self.load_error is not None:
            raise APIError(503, f"The model failed to load: {self.load_error}", code="load_failed")
        if not self.engine.ready:
            raise APIError(
                503,
                "The model is still loading",
                code="model_loading",
                headers={"Retry-After": "5"},
            )
        return self.engine

    def engine_died(self, error: Exception) -> APIError:
        """Note that the engine thread failed (its traceback is in the log); the client's 500."""
        if not self.engine_dead:
            log.error("the engine stopped: %s", error)
        self.engine_dead = True
        return APIError(500, "The engine stopped; see the server log", code="engine_dead")

    def check_model(self, requested: str | None) -> str:
        """The name to answer with; a name this server does not serve is a 404."""
        names = set(self.served_model_names)
        if requested is None or requested == self.engine.model_name:
            return self.served_model_name
        if requested in names or "*" in names:
            return requested
        raise APIError(
            404,
            f"The model '{requested}' does not exist; this server serves "
            + ", ".join(f"'{n}'" for n in self.served_model_names),
            param="model",
            code="model_not_found",
        )

    def address(self) -> str:
        return f"http://{self.settings.host}:{self.settings.port}"

    def status(self) -> dict[str, Any]:
        ready = self.ready
        stats = self.engine.stats() if ready else None
        return {
            "model": self.served_model_name
            if ready
            else (self.settings.served_model_name or [None])[0],
            "ready": ready,
            "draining": self.draining,
            "loading": None if ready else self.progress.view(),
            "load_error": self.load_error,
            "engine_dead": self.engine_dead,
            "info": self.engine.info if ready else {},
            "address": self.address(),
            "uptime_s": round(time.monotonic() - self.started_at, 3),
            "stats": {
                "running": stats.num_running if stats else 0,
                "waiting": stats.num_waiting if stats else 0,
                "kv_blocks_used": stats.kv_blocks_used if stats else 0,
                "kv_blocks_total": stats.kv_blocks_total if stats else 0,
                "prefix_cache_hit_rate": hit_rate(stats) if stats else 0.0,
                "generated_tokens_total": self.metrics.generation_tokens_total(),
                "prompt_tokens_total": self.metrics.prompt_tokens_total(),
                "requests_total": self.metrics.requests_total(),
                "errors_total": self.metrics.errors_total(),
            },
            "requests": self.tracker.view(),
            "recent_logs": list(self.logs.lines),
        }
