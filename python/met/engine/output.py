"""Turns the scheduler's per-token events into user-facing deltas: text, stop strings, logprobs."""

from __future__ import annotations

from met.engine.outputs import CompletionDelta, TokenLogprob
from met.sampling import SamplingParams
from met.tokenizer import IncrementalDetokenizer, Tokenizer


class RequestOutputState:
    """Per-request output bookkeeping; owned by the engine thread."""

    def __init__(
        self,
        request_id: str,
        prompt_len: int,
        params: SamplingParams,
        tokenizer: Tokenizer,
    ) -> None:
        self.request_id = request_id
        self.prompt_len = prompt_len
        self.params = params
        self.detok = IncrementalDetokenizer(tokenizer, params.skip_special_tokens)
        self.text = ""
        self.emitted = 0  # characters of self.text already handed out
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.finished = False
        self.stop_hit = False
        self.stop_sequence: str | None = None
        self._max_stop = max((len(s) for s in params.stop), default=0)

    def on_token(self, token_id: int, logprob: TokenLogprob | None) -> CompletionDelta:
        """Appends one generated token; a matched stop string finishes the request."""
        self.completion_tokens += 1
        search_from = max(0, len(self.text) - self._max_stop + 1)
        self.text += self.detok.push(token_id)
        cut = self._find_stop(search_from)
        if cut is not None:
            self.text = self.text[:cut]
            self.stop_hit = True
            return self._delta([token_id], logprob, finish_reason="stop")
        return self._delta([token_id], logprob, finish_reason=None)

    def on_done(self, finish_reason: str, n_tokens: int, cached: int) -> CompletionDelta:
        self.cached_tokens = cached
        self.completion_tokens = max(self.completion_tokens, n_tokens)
        if not self.stop_hit:
            self.text += self.detok.flush()
        return self._delta([], None, finish_reason=finish_reason)

    def _find_stop(self, search_from: int) -> int | None:
        best = None
        for stop in self.params.stop:
            at = self.text.find(stop, search_from)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, at + len(stop), stop)
        if best is None:
            return None
        self.stop_sequence = best[2]
        return best[1] if self.params.include_stop_str_in_output else best[0]

    def _held_back(self) -> int:
        """Length of the text's tail that could still grow into a stop string."""
        for keep in range(min(self._max_stop - 1, len(self.text)), 0, -1):
            tail = self.text[-keep:]
            if any(stop.startswith(tail) for stop in self.params.stop):
                return keep
        return 0

    def _delta(
        self, token_ids: list[int], logprob: TokenLogprob | None, finish_reason: str | None
    ) -> CompletionDelta:
        finished = finish_reason is not None
        end = len(self.text) if finished else len(self.text) - self._held_back()
        new_text = self.text[self.emitted : max(end, self.emitted)]
        self.emitted = max(end, self.emitted)
        self.finished = finished
        return CompletionDelta(
            request_id=self.request_id,
            token_ids=token_ids,
            text=new_text,
            logprobs=[logprob] if logprob is not None else None,
            finished=finished,
            finish_reason=finish_reason,
            prompt_tokens=self.prompt_len,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            stop_sequence=self.stop_sequence if finished else None,
        )
