"""What the engine hands back to its callers, one value per request per engine step."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)
    rank: int | None = None  # 1 + how many tokens the model found likelier (prompt logprobs)


@dataclass
class CompletionDelta:
    """New output of one request since the previous delta.

    `text` has stop strings already cut and never ends in half a UTF-8 character; it may be empty
    while text is held back because it could be the start of a stop string.
    """

    request_id: str
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "timeout"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stop_sequence: str | None = None  # the stop string that ended the request, if one did
    # With SamplingParams.prompt_logprobs, on the request's first delta: one entry per prompt
    # token, the first None.
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    kv_block_size: int = 0  # tokens per block
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    generated_tokens_total: int = 0
    preemptions: int = 0  # sequences requeued because the KV pool ran out, since the start
    requests: list[dict] = field(default_factory=list)  # id, state, prompt/generated tokens, age
    speculation: SpecStats | None = None  # None: speculation off


@dataclass
class SpecStats:
    """Prompt-lookup speculation so far (cumulative since the engine started)."""

    mode: str = "off"  # ngram | ngram-forced
    drafted: int = 0  # draft tokens verified
    accepted: int = 0  # of those, accepted
    verify_steps: int = 0  # decode steps that verified a draft
    verify_rows: int = 0  # sequences' rows that carried one
    withheld: int = 0  # proposed draft tokens the planner judged not worth their rows
    gate_switches: int = 0
    gate_probes: int = 0
    proposer_seconds: float = 0.0
    # Width buckets (0: 1 row, 1: 2, 2: 3-4, 3: 5-8, ...) the gate runs without drafts.
    gate_plain_buckets: list[int] = field(default_factory=list)
    # Finished requests that ran without drafts, by reason (penalties, grammar).
    requests_off: dict[str, int] = field(default_factory=dict)

    @property
    def mean_accepted_length(self) -> float:
        """Draft tokens accepted per row that carried a draft."""
        return self.accepted / self.verify_rows if self.verify_rows else 0.0


class QueueFullError(RuntimeError):
    """The waiting queue is at --max-queue; the caller should retry later (HTTP 503)."""


class EngineDeadError(RuntimeError):
    """The engine thread failed; no request can be served any more."""
