"""The offline API, in the spirit of vLLM's `LLM`: batch generation without a server."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from met.config import EngineConfig
from met.engine.core import EngineCore
from met.engine.outputs import CompletionDelta, TokenLogprob
from met.sampling import SamplingParams


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None
    # With SamplingParams.prompt_logprobs: one entry per prompt token, the first None.
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    usage: dict[str, int]

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def prompt_logprobs(self) -> list[TokenLogprob | None] | None:
        return self.outputs[0].prompt_logprobs


class LLM:
    def __init__(self, model: str | None = None, dtype: str = "auto", **engine_options) -> None:
        self.engine = EngineCore(EngineConfig(model=model, dtype=dtype, **engine_options))
        self.tokenizer = self.engine.tokenizer
        self._counter = 0

    def close(self) -> None:
        """Stops the engine; with tensor_parallel_size > 1 this also ends the worker ranks
        cleanly (without it they exit with an error when this process does)."""
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def generate(
        self,
        prompts: str | Sequence[str] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        prompt_token_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
    ) -> list[RequestOutput]:
        """Runs every prompt to completion, batched by the scheduler; outputs in prompt order."""
        token_lists = self._token_lists(prompts, prompt_token_ids)
        params = _per_prompt(sampling_params, len(token_lists))
        return self._run_batch(token_lists, params)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | None = None,
    ) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        token_lists = [self.tokenizer.encode_chat(conv) for conv in conversations]
        return self._run_batch(token_lists, _per_prompt(sampling_params, len(token_lists)))

    def stream(
        self,
        prompt: str | list[int] | None = None,
        sampling_params: SamplingParams | None = None,
        messages: list[dict] | None = None,
    ) -> Iterator[CompletionDelta]:
        """Yields one request's output as it is generated (a chat when `messages` is given)."""
        if messages is not None:
            tokens = self.tokenizer.encode_chat(messages)
        elif isinstance(prompt, str):
            tokens = self.tokenizer.encode(prompt)
        else:
            tokens = list(prompt or [])
        name = self._next_name()
        self.engine.add_request(name, tokens, sampling_params or SamplingParams())
        try:
            while self.engine.has_work():
                for delta in self.engine.step():
                    yield delta
                    if delta.finished:
                        return
        finally:
            self._drain_abort(name)

    def _drain_abort(self, name: str) -> None:
        self.engine.abort(name)
        while self.engine.has_work():
            self.engine.step()

    def _token_lists(self, prompts, prompt_token_ids) -> list[list[int]]:
        if prompt_token_ids is not None:
            ids = list(prompt_token_ids)
            return [list(ids)] if ids and isinstance(ids[0], int) else [list(p) for p in ids]
        if prompts is None:
            raise ValueError("prompts: give prompts or prompt_token_ids")
        texts = [prompts] if isinstance(prompts, str) else list(prompts)
        return [self.tokenizer.encode(text) for text in texts]

    def _next_name(self) -> str:
        self._counter += 1
        return f"llm-{self._counter}"

    def _run_batch(
        self, token_lists: list[list[int]], params: list[SamplingParams]
    ) -> list[RequestOutput]:
        for tokens, p in zip(token_lists, params, strict=True):
            self.engine.check_request(tokens, p)  # all or nothing: reject before any runs
        results: list[RequestOutput] = []
        slots: dict[str, tuple[RequestOutput, CompletionOutput]] = {}
        for tokens, p in zip(token_lists, params, strict=True):
            result = RequestOutput(self._next_name(), tokens, [], {})
            results.append(result)
            for i in range(p.n):
                result.outputs.append(CompletionOutput(index=i))
                name = f"{result.request_id}-{i}"
                self.engine.add_request(name, tokens, _nth(p, i))
                slots[name] = (result, result.outputs[-1])
        pending = set(slots)
        while pending and self.engine.has_work():
            for delta in self.engine.step():
                result, out = slots[delta.request_id]
                _apply(out, delta)
                if delta.finished:
                    pending.discard(delta.request_id)
                    _add_usage(result.usage, delta)
        return results


def _per_prompt(params, count: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams() for _ in range(count)]
    if isinstance(params, SamplingParams):
        return [params] * count
    if len(params) != count:
        raise ValueError("sampling_params: one per prompt, or a single one for all")
    return list(params)


def _nth(params: SamplingParams, i: int) -> SamplingParams:
    """The i-th of n samples: a seeded request gets seed + i so the samples differ."""
    if i == 0 or params.seed is None:
        return replace(params, n=1)
    return replace(params, n=1, seed=params.seed + i)


def _apply(out: CompletionOutput, delta: CompletionDelta) -> None:
    out.text += delta.text
    out.token_ids.extend(delta.token_ids)
    if delta.prompt_logprobs is not None:
        out.prompt_logprobs = delta.prompt_logprobs
    if delta.logprobs:
        out.logprobs = (out.logprobs or []) + delta.logprobs
    if delta.finished:
        out.finish_reason = delta.finish_reason


def _add_usage(usage: dict[str, int], delta: CompletionDelta) -> None:
    usage["prompt_tokens"] = delta.prompt_tokens
    usage["completion_tokens"] = usage.get("completion_tokens", 0) + delta.completion_tokens
    usage["cached_tokens"] = max(usage.get("cached_tokens", 0), delta.cached_tokens)
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
