"""Which sampled rows met's sampling kernel can draw, and the kernel's per-row parameters.

The kernel is the fast path for plain sampled rows; every other row (logprobs, penalties, logit
bias, masked stop tokens, constraints) goes through the torch sampler.
"""

from __future__ import annotations

import numpy as np

from met import _core


def kernel_samples(row: _core.SampleRow) -> bool:
    """Whether met's sampling kernel can draw this row: it has temperature, top-k, top-p and
    min-p only, and reports no logprobs. A row's sampler depends on its own request alone, so a
    seeded request replays the same tokens whatever shares its batch."""
    p = row.params
    return (
        p.top_logprobs < 0
        and not p.logit_bias
        and p.repetition_penalty == 1.0
        and p.presence_penalty == 0.0
        and p.frequency_penalty == 0.0
        and not (row.mask_stop and len(row.stop_tokens))
        and not p.constrained
    )


def kernel_params(rows: list[_core.SampleRow]) -> dict[str, np.ndarray]:
    params = [r.params for r in rows]
    return {
        "temperature": np.array([p.temperature for p in params], np.float32),
        "top_k": np.array([max(p.top_k, 0) for p in params], np.int32),
        "top_p": np.array([p.top_p for p in params], np.float32),
        "min_p": np.array([p.min_p for p in params], np.float32),
        # The kernel reads the int64 bits as the uint64 seed.
        "seed": np.array([p.seed for p in params], np.uint64).view(np.int64),
        "step": np.array([r.n_generated for r in rows], np.int64),
    }
