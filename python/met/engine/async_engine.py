"""The engine loop the server uses: one engine thread runs ticks; asyncio callers add and abort.

Only the engine thread touches the scheduler and the model. Other threads talk to it through a
command queue and read a stats snapshot it republishes after every tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from met.config import EngineConfig
from met.engine.core import EngineCore
from met.engine.outputs import CompletionDelta, EngineDeadError, EngineStats, QueueFullError
from met.sampling import SamplingParams

log = logging.getLogger("met.engine")

# How stale the stats snapshot (metrics, the TUI) may get while requests run.
_STATS_EVERY_S = 0.02


@dataclass
class _Subscriber:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


class RequestStream:
    """Async iterator over one request's deltas; the last one has `finished=True`."""

    def __init__(self, engine: AsyncEngine, request_id: str, inbox: asyncio.Queue) -> None:
        self._engine = engine
        self.request_id = request_id
        self._inbox = inbox
        self._done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> CompletionDelta:
        if self._done:
            raise StopAsyncIteration
        item = await self._inbox.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if item.finished:
            self._done = True
        return item

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self._engine.abort(self.request_id)


class AsyncEngine:
    def __init__(
        self, config: EngineConfig, progress: Callable[[str, int, int], None] | None = None
    ) -> None:
        self.config = config
        self._progress = progress
        self.ready = False
        self.core: EngineCore | None = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._subscribers: dict[str, _Subscriber] = {}
        self._stats = EngineStats()
        self._accepting = True
        self._stopping = False
        self._dead: BaseException | None = None
        self._thread: threading.Thread | None = None

    # --- loading ---
    def load(self) -> None:
        """Blocking: loads the model and starts the engine thread."""
        self.core = EngineCore(self.config, self._progress)
        self._stats = self.core.stats()
        self._thread = threading.Thread(target=self._run, name="met-engine", daemon=True)
        self._thread.start()
        self.ready = True

    @property
    def tokenizer(self):
        return self.core.tokenizer

    @property
    def model_name(self) -> str:
        return self.core.model_name

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary: the token ids its embedding has rows for."""
        return self.core.model_config.vocab

    @property
    def max_model_len(self) -> int:
        return self.core.max_model_len

    @property
    def keeps_state_checkpoints(self) -> bool:
        """A hybrid model with the prefix cache on: it resumes prompts from state checkpoints."""
        return self.core.backend.checkpoints is not None

    @property
    def capacity(self):
        """The CapacityPlan: weights, KV pool, what fits (met.engine.capacity)."""
        return self.core.capacity

    @property
    def info(self) -> dict:
        core = self.core
        return {
            "model_path": str(core.model_path),
            "dtype": str(core.model.dtype).removeprefix("torch."),
            "device": str(core.model.device),
            "kv_blocks_total": core.blocks.num_total_blocks(),
            "block_size": core.blocks.block_size(),
            "max_num_seqs": self.config.max_num_seqs,
            "max_model_len": core.max_model_len,
            "tensor_parallel_size": self.config.tensor_parallel_size,
            "enable_expert_parallel": self.config.enable_expert_parallel,
        }

    # --- requests (any thread with a running event loop) ---
    async def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        timeout_s: float | None = None,
    ) -> RequestStream:
        if self._dead is not None:
            raise EngineDeadError(f"the engine stopped: {self._dead}")
        if not self._accepting:
            raise QueueFullError("the server is shutting down")
        if params.constraint is None:
            self.core.check_request(prompt_token_ids, params)
        else:
            # Compiling a grammar against the tokenizer (the first one also builds llguidance's
            # tokenizer) takes up to a second within its limits: off the event loop.
            await asyncio.to_thread(self.core.check_request, prompt_token_ids, params)
        waiting = len(self._subscribers) - self.config.max_num_seqs
        if waiting >= self.config.max_queue:
            raise QueueFullError(f"the waiting queue is full ({self.config.max_queue} requests)")
        inbox: asyncio.Queue = asyncio.Queue()
        self._subscribers[request_id] = _Subscriber(asyncio.get_running_loop(), inbox)
        self._send(("add", request_id, list(prompt_token_ids), params, timeout_s))
        return RequestStream(self, request_id, inbox)

    def abort(self, request_id: str) -> None:
        self._send(("abort", request_id))

    @property
    def pooling(self) -> str | None:
        """How the model pools prompts for embeddings (or "rank"); None: it does not."""
        pooler = self.core.pooler
        return None if pooler is None else pooler.pooling

    async def pool(self, kind: str, prompts: list[list[int]], *extra: int) -> list:
        """Embeddings ("embed") or rerank scores ("score", extra: the yes and no token ids) of
        `prompts`, computed by the engine thread between scheduler steps; ValueError for inputs
        the KV pool cannot hold now."""
        if self._dead is not None:
            raise EngineDeadError(f"the engine stopped: {self._dead}")
        if not self._accepting:
            raise QueueFullError("the server is shutting down")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._send(("pool", kind, prompts, extra, loop, future))
        return await future

    def stats(self) -> EngineStats:
        return self._stats

    @property
    def dead(self) -> BaseException | None:
        """Why the engine thread stopped on a failure; None while it runs (or stopped cleanly)."""
        return self._dead

    async def shutdown(self, grace_s: float) -> None:
        """Refuses new requests, lets in-flight ones finish for `grace_s`, aborts the rest."""
        self._accepting = False
        deadline = time.monotonic() + grace_s
        while self._subscribers and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for request_id in list(self._subscribers):
            self.abort(request_id)
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)

    # --- the engine thread ---
    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wake.set()

    def _run(self) -> None:
        core = self.core
        stats_due = 0.0
        try:
            while not self._stopping:
                self._apply_commands()
                if not core.has_work():
                    self._stats = core.stats()
                    core.idle()
                    self._wake.wait(0.1)
                    self._wake.clear()
                    continue
                deltas = core.step()
                self._deliver(deltas)
                # A snapshot lists every live request: republished when one ended, else at most
                # every _STATS_EVERY_S, not once per step of a long decode.
                now = time.monotonic()
                if now >= stats_due or any(d.finished for d in deltas):
                    self._stats, stats_due = core.stats(), now + _STATS_EVERY_S
            self._apply_commands()
            core.abort_all()
            core.shutdown()
        except BaseException as exc:  # the engine thread must never die silently
            log.exception("engine thread failed")
            self._dead = exc
            self._fail_all(EngineDeadError(f"the engine stopped: {exc}"))
            core.abandon()

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "pool":
                self._pool(*command[1:])
            elif command[0] == "add":
                _, request_id, tokens, params, timeout_s = command
                try:
                    self.core.add_request(request_id, tokens, params, timeout_s)
                except ValueError as exc:
                    self._publish(request_id, exc)
            else:
                self.core.abort(command[1])
                self._publish(command[1], _aborted(command[1]))

    def _pool(self, kind, prompts, extra, loop, future) -> None:
        pooler = self.core.pooler
        try:
            result = (pooler.embed if kind == "embed" else pooler.score)(prompts, *extra)
        except ValueError as exc:
            result = exc
        except Exception as exc:  # the pooled blocks were released; the engine goes on
            log.exception("pooling failed")
            result = exc
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, future, result)

    def _deliver(self, deltas: list[CompletionDelta]) -> None:
        """Hands a step's deltas to their callers' event loops, one wake-up per loop (each
        call_soon_threadsafe writes to the loop's self-pipe), each request's in order."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, CompletionDelta]]] = {}
        for delta in deltas:
            if delta.finished:
                subscriber = self._subscribers.pop(delta.request_id, None)
            else:
                subscriber = self._subscribers.get(delta.request_id)
            if subscriber is not None:
                by_loop.setdefault(subscriber.loop, []).append((subscriber.queue, delta))
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a loop that has closed has no reader left
                loop.call_soon_threadsafe(_put_all, items)

    def _publish(self, request_id: str, item) -> None:
        subscriber = self._subscribers.pop(request_id, None)
        if subscriber is not None:
            _post(subscriber, item)

    def _fail_all(self, error: BaseException) -> None:
        for request_id in list(self._subscribers):
            self._publish(request_id, error)


def _post(subscriber: _Subscriber, item) -> None:
    """Hands an item to the caller's event loop; a loop that has closed has no reader left."""
    with contextlib.suppress(RuntimeError):
        subscriber.loop.call_soon_threadsafe(subscriber.queue.put_nowait, item)


def _put_all(items: list[tuple[asyncio.Queue, CompletionDelta]]) -> None:
    for inbox, delta in items:
        inbox.put_nowait(delta)


def _settle(future: asyncio.Future, result) -> None:
    if future.done():  # the caller went away
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def _aborted(request_id: str) -> CompletionDelta:
    """The last delta of a request the engine ended before it finished."""
    return CompletionDelta(request_id, [], "", None, True, "abort", 0, 0, 0)
