"""User-facing sampling parameters, shared by the offline API, the server and the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

ConstraintKind = Literal["json_schema", "json_object", "regex", "choice", "lark", "gbnf"]


@dataclass(frozen=True)
class Constraint:
    """Structured output: what every sampled token must keep the output a prefix of.

    `value` by kind: json_schema a schema (dict), json_object None (any object), regex a
    pattern (str, the whole output matches it), choice the allowed outputs (list[str]), lark /
    gbnf grammar text. `param` is the request field it came from, named by a 400 when the
    constraint is refused. met.constraints compiles it (llguidance); see its docstring.
    """

    kind: ConstraintKind
    value: Any = None
    param: str = "response_format"


@dataclass
class SamplingParams:
    """What a request asks of the sampler and of the stop logic (vLLM's names and defaults)."""

    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    # Logprobs of the prompt's own tokens (and this many alternatives each); with them,
    # max_tokens may be 0: the request only scores its prompt.
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    # False: control tokens the model writes stay in the text (stop tokens never do); the chat
    # pipeline asks for it when a tool-call format's markers are control tokens.
    skip_special_tokens: bool = True
    constraint: Constraint | None = None  # structured output (met.constraints)
    # Where a chat's rendered history ends in the prompt (the chat pipeline sets it for a hybrid
    # model): the next turn repeats the prompt up to there but not always the generation prompt
    # after it, so a hybrid model keeps its recurrent state at the block boundary before it.
    history_end: int | None = None

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise ValueError("<param>: <why>") for the first out-of-range field."""
        checks = [
            ("n", self.n >= 1, "must be at least 1"),
            ("max_tokens", self.max_tokens is None or self.max_tokens >= self._least, self._why),
            ("min_tokens", self.min_tokens >= 0, "must be non-negative"),
            ("temperature", 0.0 <= self.temperature <= 2.0 + 1e-9, "must be in [0, 2]"),
            ("top_p", 0.0 < self.top_p <= 1.0, "must be in (0, 1]"),
            ("top_k", self.top_k >= -1, "must be -1, 0 (off) or positive"),
            ("min_p", 0.0 <= self.min_p <= 1.0, "must be in [0, 1]"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "must be in [-2, 2]"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "must be in [-2, 2]"),
            ("repetition_penalty", 0.0 < self.repetition_penalty <= 2.0, "must be in (0, 2]"),
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= 20, "must be in [0, 20]"),
            (
                "prompt_logprobs",
                self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= 20,
                "must be in [0, 20]",
            ),
        ]
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"{name}: {why}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens: must not exceed max_tokens")
        for token_id, bias in self.logit_bias.items():
            if vocab_size is not None and not 0 <= int(token_id) < vocab_size:
                raise ValueError(f"logit_bias: token id {token_id} is outside the vocabulary")
            if not -100.0 <= float(bias) <= 100.0:
                raise ValueError("logit_bias: values must be in [-100, 100]")
        for token_id in self.stop_token_ids:
            if vocab_size is not None and not 0 <= token_id < vocab_size:
                raise ValueError(f"stop_token_ids: token id {token_id} is outside the vocabulary")
        if self.constraint is not None and self.ignore_eos:
            # Past a complete value the grammar allows only the stop tokens, so ignoring them
            # would fill max_tokens with hidden stop tokens.
            raise ValueError(
                "ignore_eos: cannot be combined with a structured-output constraint, whose "
                "output ends when its value is complete"
            )
        if self.constraint is not None:
            from met.constraints import check  # llguidance is loaded only when a request asks

            check(self.constraint)

    @property
    def _least(self) -> int:
        return 0 if self.prompt_logprobs is not None else 1

    @property
    def _why(self) -> str:
        if self.prompt_logprobs is not None:
            return "must be non-negative"
        return "must be at least 1 (0 only when scoring the prompt: echo with logprobs)"

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1
