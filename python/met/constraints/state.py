"""The model's llguidance tokenizer and compiled grammars, and one matcher per sequence."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import llguidance as llg

from met.constraints.compile import check, grammar_text, limits, one_line
from met.sampling import Constraint

_CACHED_GRAMMARS = 64  # compiled matchers kept per model, by grammar text


class _TokenTable:
    """What llguidance.TokenizerWrapper reads: token bytes by id, the special ids (named in
    grammars as `<name>`), and an encoder it uses for the text a grammar forces."""

    def __init__(self, tokenizer: Any, n_vocab: int) -> None:
        size = tokenizer.vocab_size
        # lm_head rows past the tokenizer's table are padding: empty, so never allowed.
        self.tokens = [tokenizer.token_bytes(i) for i in range(size)] + [b""] * (n_vocab - size)
        self.eos_token_id = tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None
        self.bos_token_id = None
        self.special_token_ids = sorted(i for i in tokenizer.special_ids if i < n_vocab)
        self._encode = tokenizer.encode

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("met's encoder takes text")  # TokenizerWrapper probes with bytes
        return self._encode(text)


class ModelGrammar:
    """One per model: the llguidance tokenizer (built once, on the first constrained request)
    and the compiled grammars, shared by every sequence (compiling twice costs twice)."""

    def __init__(self, tokenizer: Any, n_vocab: int) -> None:
        self._source = tokenizer
        self.n_vocab = n_vocab
        self.words = (n_vocab + 31) // 32  # int32 words of one bitmask row
        self.stop_ids = list(tokenizer.eos_token_ids)
        self._tokenizer: llg.LLTokenizer | None = None
        self._compiled: OrderedDict[str, llg.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> llg.LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                table = _TokenTable(self._source, self.n_vocab)
                # Every stop id is an end of text to llguidance: one it was not told of would
                # stay legal inside strings and cut the value short.
                self._tokenizer = llg.LLTokenizer(
                    llg.TokenizerWrapper(table), eos_token=self.stop_ids or None
                )
            return self._tokenizer

    def check(self, c: Constraint) -> llg.LLMatcher:
        """The compiled matcher of `c` (cached); ValueError("<param>: <why>") if it is refused."""
        grammar = grammar_text(c)
        if c.kind in ("lark", "gbnf"):
            self._refuse_stop_tokens(c)
        with self._lock:
            matcher = self._compiled.get(grammar)
            if matcher is not None:
                self._compiled.move_to_end(grammar)
                return matcher
        check(c, self.tokenizer)
        matcher = llg.LLMatcher(self.tokenizer, grammar, limits=limits(), log_level=0)
        if matcher.is_error():
            raise ValueError(f"{c.param}: {one_line(matcher.get_error())}")
        with self._lock:
            self._compiled[grammar] = matcher
            while len(self._compiled) > _CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        return matcher

    def start(self, c: Constraint) -> SequenceGrammar:
        return SequenceGrammar(self.check(c))

    def _refuse_stop_tokens(self, c: Constraint) -> None:
        # A stop token ends the output, so llguidance takes it as the end of text: a grammar
        # naming one could never be completed.
        for i in self.stop_ids:
            name = self._source.token_bytes(i).decode("utf-8", "replace")
            if name in c.value or f"<[{i}]>" in c.value:
                raise ValueError(
                    f"{c.param}: {name} is a stop token: the output ends where the grammar "
                    "ends, so leave it out of the grammar"
                )


class SequenceGrammar:
    """One sequence's matcher, following its output tokens.

    `sync(output)` makes the matcher have consumed exactly `output` (the new tokens are
    consumed; after a change of history, e.g. a speculative draft rejected, it rolls back to
    the common prefix first), so a preempted sequence that is prefilled again keeps its state.
    A token the grammar refuses (only an unmet min_tokens forces one past a complete value)
    frees the sequence: it is no longer constrained."""

    def __init__(self, template: llg.LLMatcher) -> None:
        self._template = template
        self.matcher = template.deep_copy()
        self.consumed: list[int] = []
        self.free = False

    def sync(self, output: Sequence[int]) -> None:
        n = len(self.consumed)
        if len(output) < n or list(output[:n]) != self.consumed:
            self.rollback(n - common_prefix(self.consumed, output))
        self.extend(output[len(self.consumed) :])

    def extend(self, tokens: Sequence[int]) -> None:
        """Consumes tokens that follow the output so far."""
        for token in tokens:
            if self.free:
                return
            if not self.matcher.consume_token(int(token)):
                self.free = True
            self.consumed.append(int(token))

    def rollback(self, k: int) -> None:
        """Forgets the last k consumed tokens (for a speculative decoder's rejected drafts)."""
        if k <= 0:
            return
        keep = self.consumed[: len(self.consumed) - k]
        if self.free or not self.matcher.rollback(k):
            # A refused token left the matcher in its error state: replay what stays.
            self.matcher, self.free, self.consumed = self._template.deep_copy(), False, []
            self.sync(keep)
            return
        self.consumed = keep

    @property
    def stopped(self) -> bool:
        """The value is complete: only a stop token may follow."""
        return self.matcher.is_stopped()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
