"""The CPU KV pool is zeroed memory that costs resident pages only where blocks are written."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from model_fixtures import tiny_config

from met.model.llama import PagedKvCache

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/statm")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_cpu_pool_is_zero_and_committed_only_where_written() -> None:
    config = tiny_config(n_layers=4, n_kv_heads=2, head_dim=64)
    before = _rss_bytes()
    cache = PagedKvCache.allocate(config, num_blocks=32768, block_size=16)  # 2 x 256 MiB
    pool_bytes = 2 * cache.k.numel() * cache.k.element_size()
    assert pool_bytes >= 512 << 20
    assert _rss_bytes() - before < pool_bytes // 8
    assert torch.count_nonzero(cache.k[:, :64]) == 0 and torch.count_nonzero(cache.v[:, -64:]) == 0
    cache.k[:, 5] = 1.0
    assert float(cache.k[:, 5].sum()) == cache.k[:, 5].numel()
    assert _rss_bytes() - before < pool_bytes // 8
