"""The CPU KV pool is zeroed memory that costs resident pages only where blocks are written."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from model_fixtures import byte_tokenizer_json, random_weights, save_hf_folder, tiny_config

import met
from met.model.kv_cache import PagedKvCache
from met.sampling import SamplingParams

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


def test_cpu_engine_reuses_cached_blocks_before_touching_new_ones(tmp_path) -> None:
    # Twenty different prompts one after another: with the prefix cache on, each finished
    # sequence leaves cached blocks; the CPU engine evicts those rather than writing (and so
    # committing) new blocks, so the pool's touched part stays at one request's worth.
    config = tiny_config(vocab=256)
    save_hf_folder(tmp_path, config, random_weights(config))
    (tmp_path / "tokenizer.json").write_text(byte_tokenizer_json())
    llm = met.LLM(model=str(tmp_path), device="cpu", kv_cache_blocks=256, block_size=4)
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for i in range(20):
        llm.generate(prompt_token_ids=[10 + i + j for j in range(20)], sampling_params=greedy)
    blocks = llm.engine.blocks
    assert blocks.num_cached_blocks() > 0
    assert blocks.num_touched_blocks() <= 2 * (28 // 4 + 1)
    llm.close()
