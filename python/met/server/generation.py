"""One HTTP generation request: its n engine requests, merged, measured and always cleaned up."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import Request

from met.engine.outputs import CompletionDelta, EngineDeadError, QueueFullError, TokenLogprob
from met.sampling import SamplingParams
from met.server.errors import APIError, ClientDisconnectedError, from_value_error
from met.server.metrics import api_label
from met.server.served_model import ServedModel
from met.server.tracking import RequestRecord

log = logging.getLogger("met.server")

_DISCONNECT_POLL_S = 0.2


@dataclass
class ChoiceResult:
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None

    def add(self, delta: CompletionDelta) -> None:
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        self.text.append(delta.text)
        self.logprobs.extend(delta.logprobs or [])


def fit_max_tokens(prompt_len: int, requested: int | None, max_model_len: int, param: str) -> int:
    """Clamp max_tokens to the room the context leaves; no room at all is a 400."""
    room = max_model_len - prompt_len
    if room <= 0:
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{prompt_len} tokens, which leaves no room to generate",
            param=param,
            code="context_length_exceeded",
        )
    return room if requested is None else min(requested, room)


def public_finish_reason(reason: str | None, request_id: str) -> str | None:
    # "timeout" is not an OpenAI finish reason; output cut short by a limit is what "length" means.
    if reason == "timeout":
        log.warning(
            "request %s hit --request-timeout; reporting finish_reason 'length'", request_id
        )
        return "length"
    return reason


def _shutting_down() -> APIError:
    return APIError(
        503, "The request was aborted: the server is shutting down", code="shutting_down"
    )


class Generation:
    def __init__(
        self, state: ServedModel, request_id: str, prompt_ids: list[int], params: SamplingParams
    ) -> None:
        self.state = state
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.params = params
        self.n = params.n
        self.streams: list = []
        self.record = RequestRecord(request_id, len(prompt_ids), time.monotonic())
        self.completion_tokens = [0] * self.n
        self.cached_tokens = 0
        self.finish_reasons: list[str | None] = [None] * self.n
        self.closed = False
        self.cancelled = False  # by POST /v1/requests/{id}/cancel
        self.api = "other"  # the metrics label, from the route start() is called on
        self.outcome: str | None = None
        self._interrupted = asyncio.Event()

    def _choice_params(self, index: int) -> SamplingParams:
        # Each choice is its own engine request; distinct seeds keep seeded choices distinct.
        seed = self.params.seed
        if seed is not None and index > 0:
            seed += index
        return dataclasses.replace(self.params, n=1, seed=seed)

    async def start(self, request: Request) -> None:
        """Submit all n engine requests before any response byte; a refusal aborts the rest."""
        engine = self.state.engine
        timeout_s = self.state.settings.request_timeout
        request.state.generation = self
        self.api = api_label(request.url.path)
        try:
            for i in range(self.n):
                rid = f"{self.request_id}-{i}"
                params = self._choice_params(i)
                stream = await engine.add_request(rid, self.prompt_ids, params, timeout_s)
                self.streams.append(stream)
        except ValueError as e:
            self.close("error")
            raise from_value_error(e) from None
        except QueueFullError as e:
            self.close("rejected")
            self.state.require_ready()  # refused because a drain began meanwhile: say so
            raise APIError(
                503, f"Server overloaded: {e}", code="queue_full", headers={"Retry-After": "1"}
            ) from None
        except EngineDeadError as e:
            self.close("error")
            raise self.state.engine_died(e) from None
        self.state.tracker.start(self.record)
        self.state.generations.add(self)
        self.state.metrics.prompt_tokens.labels(self.api).inc(len(self.prompt_ids))

    async def deltas(self) -> AsyncIterator[tuple[int, CompletionDelta]]:
        """(choice index, delta) in arrival order across the n streams, until all finish."""
        pending = {asyncio.ensure_future(anext(s)): i for i, s in enumerate(self.streams)}
        interrupted = asyncio.ensure_future(self._interrupted.wait())
        last_at = [self.record.arrived] * self.n
        try:
            while pending:
                done, _ = await asyncio.wait(
                    {*pending, interrupted}, return_when=asyncio.FIRST_COMPLETED
                )
                if interrupted in done:
                    raise _shutting_down()
                for future in done:
                    index = pending.pop(future)
                    try:
                        delta = future.result()
                    except EngineDeadError as e:
                        raise self.state.engine_died(e) from None
                    if self.cancelled and delta.finish_reason == "abort":
                        # Cancelled by id: the choice ends as a stop with what it generated.
                        generated = self.completion_tokens[index]
                        delta = dataclasses.replace(
                            delta, finish_reason="stop", completion_tokens=generated
                        )
                    last_at[index] = self._measure(index, delta, last_at[index])
                    if not delta.finished:
                        pending[asyncio.ensure_future(anext(self.streams[index]))] = index
                    yield index, delta
        finally:
            interrupted.cancel()
            for future in pending:
                future.cancel()

    def _measure(self, index: int, delta: CompletionDelta, last_at: float) -> float:
        """Feed TTFT, inter-token latency and counters; return the choice's last token time."""
        now = time.monotonic()
        metrics, record = self.state.metrics, self.record
        tokens = len(delta.token_ids)
        if tokens:
            if record.first_token_at is None:
                record.first_token_at = now
                record.state = "running"
                metrics.ttft.labels(self.api).observe(now - record.arrived)
            elif last_at != record.arrived:
                itl = metrics.itl.labels(self.api)
                for _ in range(tokens):
                    itl.observe((now - last_at) / tokens)
            record.generated_tokens += tokens
            metrics.generation_tokens.labels(self.api).inc(tokens)
            last_at = now
        self.completion_tokens[index] = delta.completion_tokens
        if delta.finished:
            self.cached_tokens = max(self.cached_tokens, delta.cached_tokens)
            self.finish_reasons[index] = delta.finish_reason
        return last_at

    async def collect(
        self, request: Request, on_delta: Callable[[int, CompletionDelta], None] | None = None
    ) -> list[ChoiceResult]:
        """Run to completion for a non-streaming response, aborting if the client leaves;
        `on_delta` sees every (choice index, delta) as it arrives."""
        results = [ChoiceResult() for _ in range(self.n)]

        async def consume() -> None:
            async for index, delta in self.deltas():
                results[index].add(delta)
                if on_delta is not None:
                    on_delta(index, delta)
                if delta.finished:
                    results[index].finish_reason = public_finish_reason(
                        delta.finish_reason, self.request_id
                    )

        task = asyncio.ensure_future(consume())
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
                if not task.done() and await request.is_disconnected():
                    raise ClientDisconnectedError
            task.result()
            self.raise_if_aborted()
        except ClientDisconnectedError:
            self.close("disconnected")
            raise
        except APIError:
            self.close("error")
            raise
        finally:
            if not task.done():
                task.cancel()
        self.close(self.outcome_label())
        return results

    def cancel(self) -> None:
        """End the engine requests now; the response still ends normally, with its usage."""
        if self.closed:
            return
        self.cancelled = True
        for stream in self.streams:
            # Through the engine rather than stream.abort(), so that the stream still delivers
            # the engine's last delta and the response can end with it.
            self.state.engine.abort(stream.request_id)

    def interrupt(self) -> None:
        """End the response now with a 503 (the drain grace ran out); the engine work is aborted."""
        self._interrupted.set()

    def raise_if_aborted(self) -> None:
        if "abort" in self.finish_reasons:
            raise _shutting_down()

    def outcome_label(self) -> str:
        if self.cancelled:
            return "cancelled"
        reason = self.finish_reasons[0] or "stop"
        return "length" if reason == "timeout" else reason

    def usage(self) -> dict:
        prompt, completion = len(self.prompt_ids), sum(self.completion_tokens)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def close(self, outcome: str) -> None:
        """Abort whatever still runs and file the request record; idempotent."""
        if self.closed:
            return
        self.closed = True
        self.outcome = outcome
        self.state.generations.discard(self)
        for stream in self.streams:
            stream.abort()
        if self.record.first_token_at is not None and outcome not in ("disconnected", "error"):
            self.state.metrics.e2e.labels(self.api).observe(time.monotonic() - self.record.arrived)
        self.state.tracker.finish(self.record, outcome)
