"""One model behind the port: its engine (loaded on first use, unloaded when idle or evicted),
its load progress and chat setup, and the server-wide parts a request needs beside them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from met.chat.setup import ChatSetup, resolve_setup
from met.config import EngineConfig
from met.server.errors import APIError

if TYPE_CHECKING:
    from met.server.state import ServerState

log = logging.getLogger("met.server")

UNLOADED, LOADING, LOADED, FAILED = "unloaded", "loading", "loaded", "failed"


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


def model_label(spec: str | None) -> str | None:
    """The name a model answers to before it is loaded, as EngineCore.model_name names it once
    loaded: a file's stem, a folder's name, a Hub reference as given; None for the default."""
    if spec is None:
        return None
    path = Path(spec).expanduser()
    if path.is_file():
        return path.stem.split(".")[0]
    if path.is_dir():
        return path.name
    return spec


EngineFactory = Callable[[EngineConfig, LoadProgress], Any]


class ServedModel:
    """A model's engine and the request-side view of the server: the pipeline and Generation
    read `engine`, `chat_setup`, `settings`, `metrics`, `tracker` and `generations` from it."""

    def __init__(
        self,
        server: ServerState,
        config: EngineConfig,
        names: list[str] | None,
        make_engine: EngineFactory,
        engine: Any = None,
        progress: LoadProgress | None = None,
    ) -> None:
        self.server = server
        self.config = config
        self._names = names  # None: the engine's own name once loaded
        self._make_engine = make_engine
        self.progress = progress or LoadProgress()
        self.engine = engine if engine is not None else make_engine(config, self.progress)
        self.status = LOADED if getattr(self.engine, "ready", False) else UNLOADED
        self.loaded_once = self.status == LOADED
        self.load_error: str | None = None
        self.engine_dead = False
        self.last_used = time.monotonic()
        self.leases = 0  # requests using this model now (ModelRouter.acquire / release)
        self._loaded: asyncio.Event | None = None
        self._chat_setup: ChatSetup | None = None

    # --- what a request reads through its model ---
    @property
    def settings(self):
        return self.server.settings

    @property
    def metrics(self):
        return self.server.metrics

    @property
    def tracker(self):
        return self.server.tracker

    @property
    def generations(self) -> set[Any]:
        return self.server.generations

    @property
    def given_names(self) -> list[str]:
        """The names the settings gave (empty: the engine's own name, known once loaded)."""
        return list(self._names or [])

    @property
    def names(self) -> list[str]:
        return list(self._names or [self.engine.model_name])

    @property
    def name(self) -> str:
        """The name answers carry by default: the first name that is not '*'."""
        names = [n for n in self.names if n != "*"]
        return names[0] if names else self.engine.model_name

    def _own_name(self) -> str | None:
        return self.engine.model_name if self.status == LOADED else None

    def answers_to(self, requested: str) -> bool:
        return requested in (self._names or []) or requested == self._own_name()

    def answer_name(self, requested: str | None) -> str:
        """The model name a response carries: the request's, unless it named none or the
        model's own file name."""
        if requested is None or requested == self._own_name():
            return self.name
        return requested

    @property
    def chat_setup(self) -> ChatSetup:
        """The tool-call format and reasoning parser of the loaded model (decided once a load)."""
        if self._chat_setup is None:
            self._chat_setup = resolve_setup(
                self.engine.tokenizer.chat_template,
                self.settings.tool_call_parser,
                self.settings.reasoning_parser,
            )
        return self._chat_setup

    @property
    def ready(self) -> bool:
        return bool(self.engine.ready) and self.load_error is None and not self.engine_dead

    def require_ready(self) -> Any:
        """The engine, or a 503 while the model loads or the server drains."""
        if self.server.draining:
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
                f"The model{'' if self._names is None else f' {self.name!r}'} is still loading",
                code="model_loading",
                headers={"Retry-After": "5"},
            )
        return self.engine

    def engine_died(self, error: Exception) -> APIError:
        """Note that the engine thread failed (its traceback is in the log); the client's 500."""
        if not self.engine_dead:
            log.error("the engine of '%s' stopped: %s", self.name, error)
        self.engine_dead = True
        return APIError(500, "The engine stopped; see the server log", code="engine_dead")

    # --- loading and unloading (the event loop; the blocking load runs in a thread) ---
    def load_blocking(self) -> None:
        """Load in the calling thread (the server's startup load of the default model)."""
        self.status = LOADING
        try:
            self.engine.load()
        except Exception as e:
            self.status = FAILED
            self.load_error = f"{type(e).__name__}: {e}"
            raise
        self.status = LOADED
        self.loaded_once = True
        self.last_used = time.monotonic()

    async def ensure_loaded(self, timeout_s: float) -> None:
        """Load the model if it is not (one load however many requests wait for it); a 503 when
        it takes longer than `timeout_s` (the load goes on) or fails."""
        if self.status == LOADED:
            return
        if self.status in (UNLOADED, FAILED) and self._loaded is None:
            self._loaded = asyncio.Event()
            asyncio.ensure_future(self._load_in_thread(self._loaded))
        event = self._loaded
        if event is None:  # the startup load runs in the lifecycle's thread
            self.require_ready()
            return
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except asyncio.TimeoutError:
            raise APIError(
                503,
                f"The model '{self.name}' is still loading",
                code="model_loading",
                headers={"Retry-After": "5"},
            ) from None
        if self.status != LOADED:
            raise APIError(503, f"The model failed to load: {self.load_error}", code="load_failed")

    async def _load_in_thread(self, event: asyncio.Event) -> None:
        if self.engine.ready or self.status == FAILED:
            self.engine = self._make_engine(self.config, self.progress)
        self.load_error = None
        self._chat_setup = None
        started = time.monotonic()
        log.info("loading '%s' (%s)", self.name, self.config.model)
        try:
            await asyncio.to_thread(self.load_blocking)
            log.info("'%s' loaded in %.1fs", self.name, time.monotonic() - started)
        except Exception:
            log.exception("'%s' failed to load", self.name)
        finally:
            self._loaded = None
            event.set()

    async def unload(self, why: str) -> None:
        """Stop the engine (its thread joined, its KV pool and weights released with it)."""
        if self.status != LOADED:
            return
        log.info("unloading '%s' (%s)", self.name, why)
        self.status = UNLOADED
        engine = self.engine
        await engine.shutdown(0.0)
        self.engine = self._make_engine(self.config, self.progress)
        self._chat_setup = None

    def memory_bytes(self) -> int:
        """Its weights and KV pool once loaded (the capacity plan's); before, its files' size
        (0 for a Hub model not downloaded yet)."""
        if self.status == LOADED and self.ready:
            plan = self.engine.capacity
            return plan.weights_bytes + plan.kv_tokens * plan.kv_token_bytes
        path = Path(self.config.model or "").expanduser()
        if self.config.model is None or not path.exists():
            return 0
        if path.is_file():
            return path.stat().st_size
        return sum(p.stat().st_size for p in path.glob("*.safetensors"))

    def view(self) -> dict[str, Any]:
        """This model's entry in /status."""
        loaded = self.status == LOADED and self.ready
        stats = self.engine.stats() if loaded else None
        return {
            "name": self.name if self._names or loaded else None,
            "state": self.status,
            "model": self.config.model,
            "loading": self.progress.view() if self.status == LOADING else None,
            "load_error": self.load_error,
            "in_flight": self.leases,
            "running": stats.num_running if stats else 0,
            "waiting": stats.num_waiting if stats else 0,
            "kv_blocks_used": stats.kv_blocks_used if stats else 0,
            "kv_blocks_total": stats.kv_blocks_total if stats else 0,
        }
