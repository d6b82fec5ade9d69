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
on at each boundary). A new prompt resumes from the longest checkpointed boundary whose KV blocks
are still cached. Which checkpoint holds which prefix is the core's index
(_core.StateCheckpoints, csrc/include/met/state_checkpoints.h): keyed by the block manager's own
block hashes, kept least recently used first out, and dropped when the block manager evicts the
block before it. The backend copies the states the index names (engine/torch_backend.py).
Speculation stays exact: a verify row keeps the recurrent state after each of its tokens and the
backend puts back the one after the last accepted token (RecurrentState.restore). Tensor
parallelism (which does not split recurrent layers) is refused.
"""

from __future__ import annotations

import logging

from met import _core
from met.config import EngineConfig

log = logging.getLogger("met.engine")

# Positions between checkpoints inside a prompt: a multiple of 64, where the C++ forward's
# prefill chunks end anyway, so a checkpoint there adds no chunk boundary.
CHECKPOINT_INTERVAL = 512


def hybrid_off(model: object, config: EngineConfig) -> None:
    """Refuse, from `config`, what a model with recurrent layers cannot run."""
    if getattr(model, "recurrent_layers", None) and config.tensor_parallel_size > 1:
        raise ValueError("tensor parallelism does not split recurrent layers (hybrid models)")


def state_checkpoints(
    kv_cache: object, blocks: _core.BlockManager, config: EngineConfig
) -> _core.StateCheckpoints | None:
    """A hybrid model's checkpoint index when the prefix cache is on (None otherwise), its
    states allocated in the model's RecurrentState."""
    state = getattr(kv_cache, "state", None)
    if state is None or not blocks.prefix_cache_enabled():
        return None
    count = config.state_checkpoints or config.max_num_seqs
    checkpoints = _core.StateCheckpoints(blocks, count, CHECKPOINT_INTERVAL)
    state.keep_checkpoints(count)
    size = state.ckpt_conv.nbytes + state.ckpt_delta.nbytes
    log.info(
        "prefix caching of a hybrid model: up to %d recurrent-state checkpoints (%.1f MiB)",
        count,
        size / 2**20,
    )
    return checkpoints
