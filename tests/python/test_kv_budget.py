"""KV pool sizing (met.engine.kv_budget): the numbers the engine allocates from."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import tiny_config

from met.engine.kv_budget import activation_reserve, gpu_budget, kv_dtype, pool_blocks, pool_shape
from met.server.settings import load_settings

GIB = 1 << 30


def test_pool_shape_counts_k_and_v_of_every_layer_and_this_ranks_heads() -> None:
    config = tiny_config()  # 2 layers, 2 kv heads of 16
    shape = pool_shape(config, element=2, block_size=16, max_model_len=100, tp_size=1)
    assert shape.block_bytes == 2 * 2 * 2 * 16 * 2 * 16
    assert shape.context_blocks == 7 + 1
    split = pool_shape(config, element=2, block_size=16, max_model_len=100, tp_size=2)
    assert split.block_bytes == shape.block_bytes // 2


def test_pool_blocks_stops_at_every_sequences_full_context_and_never_below_one() -> None:
    shape = pool_shape(tiny_config(), 4, 16, 256, 1)
    assert pool_blocks(shape, max_num_seqs=8, budget_bytes=100 * GIB) == 8 * shape.context_blocks
    room_for_three = 3 * shape.context_blocks * shape.block_bytes + 1
    assert pool_blocks(shape, 8, room_for_three) == 3 * shape.context_blocks
    assert pool_blocks(shape, 8, 10) == shape.context_blocks


def test_gpu_budget_is_the_allowed_share_less_what_is_held_and_the_reserve() -> None:
    total, free = 140 * GIB, 120 * GIB  # 20 GiB held: weights, other processes
    assert gpu_budget(total, free, 0.9, 2 * GIB) == int(total * 0.9) - 20 * GIB - 2 * GIB


def test_gpu_budget_says_what_to_change_when_nothing_is_left() -> None:
    with pytest.raises(ValueError, match="raise --gpu-memory-utilization"):
        gpu_budget(80 * GIB, 10 * GIB, 0.9, 2 * GIB)
    with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
        gpu_budget(80 * GIB, 70 * GIB, 1.5, GIB)


def test_activation_reserve_grows_with_the_step_and_the_batch() -> None:
    config = tiny_config()
    base = activation_reserve(config, 2, max_batch_tokens=1024, max_num_seqs=8)
    assert activation_reserve(config, 2, 2048, 8) > base
    assert activation_reserve(config, 2, 1024, 64) > base
    assert base > 512 << 20  # the fixed slack for cuBLAS and the graphs


def test_the_setting_reaches_the_engine_config() -> None:
    settings = load_settings(["--gpu-memory-utilization", "0.5"], env={})
    assert settings.engine.gpu_memory_utilization == 0.5
    env = {"MET_GPU_MEMORY_UTILIZATION": "0.7"}
    assert load_settings([], env=env).engine.gpu_memory_utilization == 0.7


def test_kv_dtype_auto_is_half_for_the_cpp_forward_and_the_models_otherwise() -> None:
    assert kv_dtype("auto", torch.float32, cpp_cpu_forward=True) == torch.float16
    assert kv_dtype("auto", torch.bfloat16, cpp_cpu_forward=False) == torch.bfloat16
    assert kv_dtype("float32", torch.float32, cpp_cpu_forward=True) == torch.float32
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_dtype("int8", torch.float32, cpp_cpu_forward=True)
    assert load_settings(["--kv-cache-dtype", "float32"], env={}).engine.kv_cache_dtype == "float32"


@pytest.mark.slow
def test_the_default_model_on_the_cpu_keeps_fp16_kv_unless_asked(default_model_path) -> None:
    import met
    from met.model.cpu_llama import CpuLlama

    with met.LLM(model=str(default_model_path), device="cpu", kv_cache_blocks=64) as half:
        assert isinstance(half.engine.backend.model, CpuLlama)
        assert half.engine.backend.kv_cache.k.dtype == torch.float16
    with met.LLM(
        model=str(default_model_path), device="cpu", kv_cache_blocks=64, kv_cache_dtype="float32"
    ) as full:
        assert isinstance(full.engine.backend.model, CpuLlama)
        assert full.engine.backend.kv_cache.k.dtype == torch.float32
