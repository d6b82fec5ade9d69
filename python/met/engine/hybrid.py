"""What the engine does differently for a hybrid model (recurrent layers beside attention,
Qwen3.5 / Qwen3-Next): refusing what it cannot run, and prefix caching through state checkpoints.

Cached KV blocks resume attention layers only; a recurrent layer needs its state as of the cached
prefix. So the forward keeps the recurrent state at block boundaries (RecurrentState's checkpoint
pool): at the end of each prompt's last full block (what the same prompt again resumes from),
every `interval` positions inside a prompt (what another prompt with the same system prompt and
tools resumes from), at the last block boundary before a chat prompt's rendered history ends
(SamplingParams.history_end: the next turn repeats the history, not always the generation prompt
after it), and at the last block boundary a sequence's decode passed (where a template renders
the reply as generated, the next turn resumes after it; one such checkpoint per sequence, moved
on at each boundary). A new prompt resumes from the longest
checkpointed boundary whose KV blocks are still cached; the checkpoints are kept least recently
used first out, and one whose blocks were evicted is dropped when a lookup finds them gone.
Speculation stays exact: a verify row keeps the recurrent state after each of its tokens and the
backend puts back the one after the last accepted token (RecurrentState.restore). Tensor
parallelism (which does not split recurrent layers) is refused.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from met import _core
from met.config import EngineConfig
from met.engine.forward_rows import Row
from met.model.recurrent_state import RecurrentState

log = logging.getLogger("met.engine")

# Positions between checkpoints inside a prompt: a multiple of 64, where the C++ forward's
# prefill chunks end anyway, so a checkpoint there adds no chunk boundary.
CHECKPOINT_INTERVAL = 512


def hybrid_off(model: object, config: EngineConfig) -> None:
    """Refuse, from `config`, what a model with recurrent layers cannot run."""
    if getattr(model, "recurrent_layers", None) and config.tensor_parallel_size > 1:
        raise ValueError("tensor parallelism does not split recurrent layers (hybrid models)")


@dataclass
class _Turn:
    """A sequence's checkpoint at the last block boundary its decode passed."""

    boundary: int  # the positions before it
    key: int
    index: int
    written: bool  # by this sequence (then its next boundary's takes its place)
    final: bool  # its tokens all stand (not a verify row's drafts, which may be rejected)


class StateCheckpoints:
    """The checkpoints of a hybrid model's recurrent state, keyed by the tokens before them (one
    hash chained block by block, as the block manager's prefix hashes are)."""

    def __init__(
        self,
        state: RecurrentState,
        count: int,
        block_size: int,
        interval: int = CHECKPOINT_INTERVAL,
    ) -> None:
        if count < 1 or interval % block_size:
            raise ValueError("state checkpoints: a count >= 1, an interval of whole blocks")
        state.keep_checkpoints(count)
        self.state, self.block_size, self.interval = state, block_size, interval
        self._index: OrderedDict[int, int] = OrderedDict()  # key -> checkpoint, oldest first
        self._free = list(range(count - 1, -1, -1))
        self._pending: list[tuple[int, int]] = []  # (key, index) the running forward writes
        # By sequence id. A verify row's checkpoint stands even if the drafts that reached it
        # are rejected: it is the state after those tokens, keyed by them.
        self._turns: dict[int, _Turn] = {}

    def resume(self, blocks: _core.BlockManager, seq: _core.Sequence, prompt: Sequence[int]) -> int:
        """Allocate `seq`'s blocks from the longest cached prefix a checkpoint resumes, restore
        that checkpoint into its slot and return the prefix's length (0: none). The scheduler's
        KvLedger, which asked, takes the table from `blocks` and sets the sequence's fields."""
        seq_id, bs = seq.session_hash, self.block_size
        keys = self._keys(prompt, (len(prompt) - 1) // bs)
        for boundary in range(len(keys), 0, -1):
            index = self._index.get(keys[boundary - 1])
            if index is None:
                continue
            length = boundary * bs
            # Only the blocks before the checkpoint: those after it are computed anew.
            if blocks.allocate_prefix(seq_id, list(prompt[: length + 1])) == length:
                self._index.move_to_end(keys[boundary - 1])
                self.state.restore_checkpoint(index, seq.state_slot)
                return length
            blocks.release(seq_id)
            self._drop(keys[boundary - 1])  # its blocks were evicted
        blocks.allocate_prefix(seq_id, [])
        return 0

    def plan(self, rows: list[Row], history_ends: dict[int, int]) -> list[int]:
        """The (row, position, index) triples, flat, of the checkpoints this forward's prompt
        rows pass (`history_ends`: where a chat prompt's rendered history ends, by request
        id); their keys count once the forward has run (commit)."""
        marks: list[int] = []
        for i, row in enumerate(rows):
            end = row.start + len(row.tokens)
            if row.draft or len(row.tokens) < 2 or row.start >= row.seq.prompt_len:
                continue
            known = row.seq.tokens + row.tokens  # the history before this row, then the row
            history = history_ends.get(row.seq.session_hash)
            positions = self._positions(row.start, min(end, row.seq.prompt_len), row, history)
            for position in positions:
                key = self._keys(known, position // self.block_size)[-1]
                if key in self._index:
                    self._index.move_to_end(key)
                    continue
                index = self._take()
                if index is None:  # every checkpoint is being written this step
                    break
                self._pending.append((key, index))
                marks += [i, position, index]
        return marks

    def commit(self, rows: list[Row]) -> None:
        """The planned checkpoints were written, and the forward of `rows` ran: its decode and
        verify rows that reached a block boundary leave their state there as their turn's."""
        for key, index in self._pending:
            self._index[key] = index
        self._pending.clear()
        for row in rows:
            if row.draft or len(row.tokens) == 1:
                self._pass_boundary(row)

    def forget(self, seq: _core.Sequence) -> None:
        """`seq` left its slot: its turn checkpoint stays, as any other, least recently used out."""
        self._turns.pop(seq.session_hash, None)

    def _pass_boundary(self, row: Row) -> None:
        bs, seq = self.block_size, row.seq
        boundary = (row.start + len(row.tokens)) // bs * bs
        if boundary <= row.start:
            return
        previous = self._turns.get(seq.session_hash)
        key = self._turn_key(row, boundary, previous)
        token = boundary - row.start - 1  # the row's token that reached it
        index, written = self._index.get(key), False
        if index is not None:
            self._index.move_to_end(key)
        else:
            index = self._take()
            if index is None:
                return
            self.state.checkpoint(index, seq.state_slot, token if row.draft else None)
            self._index[key], written = index, True
        moved_on = previous is not None and previous.written and previous.key != key
        if moved_on and self._index.get(previous.key) == previous.index:
            self._drop(previous.key)  # one turn checkpoint per sequence
        final = not row.draft or token == 0  # a verify row's first token is the sampled one
        self._turns[seq.session_hash] = _Turn(boundary, key, index, written, final)

    def _turn_key(self, row: Row, boundary: int, previous: _Turn | None) -> int:
        # The chain from the sequence's previous boundary when it is the block before and its
        # tokens stand, else from the whole history (its first boundary in decode, or after
        # drafts).
        bs, seq = self.block_size, row.seq
        if previous is None or previous.boundary != boundary - bs or not previous.final:
            return self._keys(seq.tokens + row.tokens, boundary // bs)[-1]
        first = min(boundary - bs, row.start)
        tail = seq.tokens_from(first) + row.tokens
        return _chained(previous.key, tail[boundary - bs - first : boundary - first])

    def abandon(self) -> None:
        """The planned checkpoints were not written (the forward failed)."""
        self._free += [index for _, index in self._pending]
        self._pending.clear()

    def _positions(self, start: int, end: int, row: Row, history: int | None) -> list[int]:
        # Block boundaries in (start, end]: every interval's, the prompt's last full block and
        # the one before its rendered history's end.
        bs = self.block_size
        wanted = {p for p in range(start + 1, end + 1) if p % self.interval == 0}
        for position in (row.seq.prompt_len, history or 0):
            boundary = min(position, row.seq.prompt_len) // bs * bs
            if start < boundary <= end:
                wanted.add(boundary)
        return sorted(wanted)

    def _take(self) -> int | None:
        if not self._free and self._index:
            self._free.append(self._index.popitem(last=False)[1])  # the least recently used
        return self._free.pop() if self._free else None

    def _drop(self, key: int) -> None:
        self._free.append(self._index.pop(key))

    def _keys(self, tokens: Sequence[int], blocks: int) -> list[int]:
        keys, last, bs = [], 0, self.block_size
        for j in range(blocks):
            last = _chained(last, tokens[j * bs : (j + 1) * bs])
            keys.append(last)
        return keys


def _chained(parent: int, block: Sequence[int]) -> int:
    """A block's key: its tokens chained onto the key of the blocks before it."""
    return hash((parent, tuple(block)))


def state_checkpoints(
    kv_cache: object, blocks: _core.BlockManager, config: EngineConfig
) -> StateCheckpoints | None:
    """A hybrid model's checkpoints when the prefix cache is on (None otherwise)."""
    state = getattr(kv_cache, "state", None)
    if state is None or not blocks.prefix_cache_enabled():
        return None
    count = config.state_checkpoints or config.max_num_seqs
    checkpoints = StateCheckpoints(state, count, config.block_size, CHECKPOINT_INTERVAL)
    size = checkpoints.state.ckpt_conv.nbytes + checkpoints.state.ckpt_delta.nbytes
    log.info(
        "prefix caching of a hybrid model: up to %d recurrent-state checkpoints (%.1f MiB)",
        count,
        size / 2**20,
    )
    return checkpoints
