"""The server's shared state: its models (met.server.router), readiness, draining, metrics,
request records, logs."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from starlette.requests import Request

from met.config import EngineConfig
from met.engine.outputs import EngineStats
from met.server.errors import APIError
from met.server.metrics import ServerMetrics, hit_rate
from met.server.router import ModelRouter
from met.server.served_model import LoadProgress, ServedModel
from met.server.settings import ServerSettings
from met.server.tracking import RecentLogs, RequestTracker

log = logging.getLogger("met.server")

_SUMMED = (
    "num_running",
    "num_waiting",
    "kv_blocks_used",
    "kv_blocks_total",
    "prefix_cache_queried_tokens",
    "prefix_cache_hit_tokens",
    "generated_tokens_total",
    "preemptions",
)


def _async_engine(config: EngineConfig, progress: LoadProgress) -> Any:
    from met.engine.async_engine import AsyncEngine  # torch, only once a model loads

    return AsyncEngine(config, progress=progress)


class ServerState:
    """Server-wide state. `engine`, `chat_setup`, `require_ready` and the names are the first
    (default) model's; a request gets its own model's through `model_for`."""

    def __init__(
        self,
        engine: Any,
        settings: ServerSettings,
        logs: RecentLogs | None = None,
        progress: LoadProgress | None = None,
        make_engine=_async_engine,
    ) -> None:
        self.settings = settings
        self.metrics = ServerMetrics(self._engine_stats, self._model_stats)
        self.tracker = RequestTracker()
        self.logs = logs or RecentLogs()
        self.started_at = time.monotonic()
        self.draining = False
        self.generations: set[Any] = set()  # the in-flight Generation objects
        self.router = ModelRouter(self, make_engine, engine, progress)

    @property
    def default(self) -> ServedModel:
        return self.router.default

    @property
    def engine(self) -> Any:
        return self.default.engine

    @property
    def progress(self) -> LoadProgress:
        return self.default.progress

    @property
    def load_error(self) -> str | None:
        return self.default.load_error

    @property
    def engine_dead(self) -> bool:
        return any(m.engine_dead for m in self.router.models)

    def _engine_stats(self) -> tuple[EngineStats | None, bool]:
        """The loaded models' stats summed (a replica's load, as a router reads it); the first
        model's speculation."""
        ready = self.ready
        loaded = [m.engine.stats() for m in self.router.loaded() if m.ready]
        if not ready or not loaded:
            return None, ready
        total = EngineStats(speculation=loaded[0].speculation if self.default.ready else None)
        for stats in loaded:
            for name in _SUMMED:
                setattr(total, name, getattr(total, name) + getattr(stats, name))
        return total, ready

    def _model_stats(self) -> list[tuple[str, str, EngineStats | None]]:
        out = []
        for m in self.router.models:
            if m.given_names or m.ready:
                out.append((m.name, m.status, m.engine.stats() if m.ready else None))
        return out

    @property
    def ready(self) -> bool:
        """Serving: the first model loaded at startup (it may since have been unloaded: a
        request reloads it) and no engine failed."""
        return self.default.loaded_once and not self.engine_dead

    @property
    def served_model_names(self) -> list[str]:
        return self.default.names

    @property
    def served_model_name(self) -> str:
        return self.default.name

    @property
    def chat_setup(self):
        return self.default.chat_setup

    def require_ready(self) -> None:
        """A 503 while the server starts, drains or has lost an engine."""
        if self.draining or self.engine_dead or not self.ready:
            failed = next((m for m in self.router.models if m.engine_dead), self.default)
            failed.require_ready()
            raise APIError(503, "The model is still loading", code="model_loading")

    def engine_died(self, error: Exception) -> APIError:
        return self.default.engine_died(error)

    async def model_for(self, requested: str | None, request: Request | None) -> ServedModel:
        """The model a request names, loaded and leased to it; 404 for an unknown name, 503
        while the server drains or the model cannot load in time."""
        return await self.router.acquire(requested, request)

    def address(self) -> str:
        return f"http://{self.settings.host}:{self.settings.port}"

    def status(self) -> dict[str, Any]:
        ready = self.ready
        stats = self._engine_stats()[0]  # the loaded models' sums
        return {
            "model": self.served_model_name
            if ready
            else (self.settings.served_model_name or [None])[0],
            "ready": ready,
            "draining": self.draining,
            "loading": None if ready else self.progress.view(),
            "load_error": self.load_error,
            "engine_dead": self.engine_dead,
            "info": self.engine.info if self.default.ready else {},
            "models": [m.view() for m in self.router.models],
            # One per loaded model: an unloaded model's thread has been joined.
            "engine_threads": sum(t.name == "met-engine" for t in threading.enumerate()),
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
