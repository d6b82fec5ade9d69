"""Token bitmasks of the constrained rows, computed on a worker thread while the forward runs.

The backend starts the batch (`start`) once the rows' matchers have consumed the tokens the
forward is about to write, then runs the forward: llguidance drops the GIL while it fills the
masks and the C++ CPU forward (or the GPU) drops it too, so the two overlap. The sampler joins
(`wait`) and reads each row's mask (`take`); rows without a constraint never touch this.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import llguidance as llg
import torch

from met.constraints.state import SequenceGrammar


class MaskPrefetch:
    def __init__(self, n_vocab: int) -> None:
        self.words = (n_vocab + 31) // 32
        self._executor: llg.LLExecutor | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._buffer = torch.empty((0, self.words), dtype=torch.int32)
        # (request id, output position) -> (buffer row, the state's matcher and length then).
        self._rows: dict[tuple[int, int], tuple[int, int, int]] = {}

    def start(self, rows: list[tuple[int, SequenceGrammar, list[int]]]) -> None:
        """Fills, in the background, each state's next mask and, for a row that carries draft
        tokens (speculative decoding), the mask after each draft token too. A draft is walked
        on a copy of the matcher, so the state keeps its place: llguidance's draft fill rolls
        the drafts back, which it refuses for grammars with max_tokens or stop lexemes (the
        thinking budget), leaving the matcher in its error state."""
        self.wait()
        live = [(rid, s, d) for rid, s, d in rows if not s.free]
        self._rows, jobs, n = {}, [], 0
        for rid, state, drafts in live:
            done = len(state.consumed)
            for j in range(1 + len(drafts)):
                self._rows[(rid, done + j)] = (n + j, id(state.matcher), done)
            jobs.append((state.matcher, n, drafts))
            n += 1 + len(drafts)
        if not jobs:
            return
        if self._pool is None:
            self._executor = llg.LLExecutor()
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="met-grammar-masks")
        # Past a draft token the grammar refuses no mask is written: allow all there (the
        # scheduler accepts no token past the first that differs from the draft).
        self._buffer = torch.full((n, self.words), -1, dtype=torch.int32)
        ptr, size = self._buffer.data_ptr(), self.words * 4
        # llguidance's draft fill takes only rows that carry drafts (an empty one is an error).
        drafted = [(matcher.deep_copy(), i, drafts) for matcher, i, drafts in jobs if drafts]
        plain = [(matcher, i) for matcher, i, drafts in jobs if not drafts]
        self._pending = self._pool.submit(self._fill, drafted, plain, ptr, size, n)

    def _fill(self, drafted: list, plain: list, ptr: int, size: int, n: int) -> None:
        assert self._executor is not None
        if drafted:
            self._executor.unsafe_compute_mask_ptr_with_draft_token(drafted, ptr, size, n)
        if plain:
            self._executor.unsafe_compute_mask_ptr(plain, ptr, size, n)

    def wait(self) -> None:
        """Joins the batch in flight (its matchers may be read or moved on only after this)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def take(self, rid: int, state: SequenceGrammar, output: list[int]) -> torch.Tensor | None:
        """The int32 bitmask row [words] of the token after `output` (None: unconstrained).
        One not computed in the background, or whose state moved since, is computed now."""
        self.wait()
        where = self._rows.get((rid, len(output)))
        unmoved = where is not None and where[1:] == (id(state.matcher), len(state.consumed))
        if unmoved and not state.free:
            return self._buffer[where[0]]
        state.sync(output)
        if state.free:
            return None
        row = torch.empty(self.words, dtype=torch.int32)
        state.matcher.unsafe_compute_mask_ptr(row.data_ptr(), self.words * 4)
        return row

    def close(self) -> None:
        self.wait()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
