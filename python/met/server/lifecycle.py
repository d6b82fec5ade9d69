"""Loading in the background, and draining on SIGTERM/SIGINT before a clean exit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator

import uvicorn

from met.server.state import ServerState

log = logging.getLogger("met.server")

_FLUSH_S = 2.0  # after the engine drained, time for the last responses to reach their clients
_WATCH_S = 0.2  # how often a loaded server checks that its engine still runs


class QuietSignalServer(uvicorn.Server):
    """uvicorn re-raises a captured SIGTERM after serving, which would turn a clean drain into
    death-by-signal; the Lifecycle installs its own handlers instead."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Lifecycle:
    def __init__(self, state: ServerState, server: uvicorn.Server) -> None:
        self.state = state
        self.server = server
        self.exit_code = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None
        self._idle_task: asyncio.Task | None = None

    def start(self) -> None:
        """Call on the running loop, before serving: signal handlers and the loading thread."""
        self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._on_signal, sig)
        threading.Thread(target=self._load, name="met-load", daemon=True).start()
        idle = self.state.settings.model_idle_timeout
        if idle is not None:
            self._idle_task = asyncio.ensure_future(self._unload_idle(idle))

    async def _unload_idle(self, idle_s: float) -> None:
        while not self.state.draining:
            await asyncio.sleep(min(max(idle_s / 4, 0.05), 1.0))
            await self.state.router.unload_idle(idle_s)

    def _load(self) -> None:
        started = time.monotonic()
        log.info("loading the model (%s)", self.state.default.config.model or "default model")
        try:
            self.state.default.load_blocking()
        except Exception:
            log.exception("the model failed to load")
            self.exit_code = 1
            self._call(self._stop_now)
            return
        engine = self.state.engine
        webui = "" if self.state.settings.no_webui else " (chat page at /)"
        log.info(
            "ready in %.1fs: serving '%s' on %s%s, context %d. %s",
            time.monotonic() - started,
            self.state.served_model_name,
            self.state.address(),
            webui,
            engine.max_model_len,
            engine.capacity.describe(),
        )
        if engine.core.split is not None:
            log.info("%s", engine.core.split)
        log.debug("engine: %s", ", ".join(f"{k}={v}" for k, v in engine.info.items()))
        others = [m.name for m in self.state.router.models[1:]]
        if others:
            log.info(
                "also serving %s: each loads on first use, at most %d at once",
                ", ".join(f"'{n}'" for n in others),
                self.state.settings.max_loaded_models,
            )
        setup = self.state.chat_setup
        log.info(
            "tool calls: %s format (%s); reasoning parser: %s",
            setup.tool_format,
            setup.tool_source,
            setup.reasoning or "none",
        )
        self._watch_engine()

    def _watch_engine(self) -> None:
        # A failed engine (a tensor-parallel worker died, a collective timed out) cannot
        # recover: /health turns 503 and the process exits non-zero for its supervisor.
        while True:
            dead = [m for m in self.state.router.loaded() if m.engine.dead is not None]
            if dead:
                break
            time.sleep(_WATCH_S)
        log.error("the engine of '%s' stopped (%s); exiting", dead[0].name, dead[0].engine.dead)
        self.exit_code = 1
        self._call(lambda: self._engine_died(dead[0]))

    def _engine_died(self, model) -> None:
        model.engine_died(model.engine.dead)
        self.server.should_exit = True

    def _call(self, callback) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(callback)

    def _stop_now(self) -> None:
        self.server.should_exit = True

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._drain_task is not None:
            log.warning("%s again: exiting without waiting", sig.name)
            self.server.force_exit = True
            self.server.should_exit = True
            return
        grace = self.state.settings.shutdown_grace
        log.info(
            "%s: refusing new requests, draining in-flight ones for up to %gs", sig.name, grace
        )
        self.state.draining = True
        self._drain_task = asyncio.ensure_future(self._drain(grace))

    async def _drain(self, grace: float) -> None:
        # The server runs the grace period itself, so that requests still running when it ends
        # get a proper 503 (or an error event) before the engine aborts their work.
        state = self.state
        deadline = time.monotonic() + grace
        while state.generations and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if state.generations:
            log.warning(
                "aborting %d requests still running after the grace", len(state.generations)
            )
            for generation in list(state.generations):
                generation.interrupt()
        deadline = time.monotonic() + _FLUSH_S
        while state.tracker.active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for model in state.router.loaded():
            await model.engine.shutdown(0.0)
        self.server.should_exit = True
