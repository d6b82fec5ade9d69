"""What the engine turns off for a hybrid model (recurrent layers beside attention, Qwen3.5 /
Qwen3-Next), where it would otherwise give wrong tokens silently.

Prefix caching: cached KV blocks resume attention layers only; a recurrent layer would need its
state as of the cached prefix, which met does not checkpoint yet. It is switched off with a log
line; tensor parallelism (which does not split recurrent layers) is refused. Speculation stays on:
a verify row keeps the recurrent state after each of its tokens and the backend puts back the
one after the last accepted token (model/deltanet.py, RecurrentState.restore).
"""

from __future__ import annotations

import logging

from met.config import EngineConfig

log = logging.getLogger("met.engine")


def hybrid_off(model: object, config: EngineConfig) -> None:
    """Switch off, in `config`, what a model with recurrent layers cannot run yet."""
    if not getattr(model, "recurrent_layers", None):
        return
    if config.tensor_parallel_size > 1:
        raise ValueError("tensor parallelism does not split recurrent layers (hybrid models)")
    if config.enable_prefix_cache:
        log.info("prefix caching is off: the model has recurrent layers (no state checkpoints)")
        config.enable_prefix_cache = False
