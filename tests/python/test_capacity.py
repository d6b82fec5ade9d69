"""The capacity plan's figures and words (no model: the plan is plain arithmetic)."""

from __future__ import annotations

import torch

from met.engine.capacity import CapacityPlan, weight_bytes
from met.kernels.cpu_quant import QuantLinear


def _plan(**changes) -> CapacityPlan:
    fields = {
        "device": "cpu",
        "weights_bytes": 96 << 20,
        "kv_dtype": "float16",
        "kv_token_bytes": 23040,
        "kv_blocks": 4104,
        "block_size": 16,
        "max_num_seqs": 8,
        "max_model_len": 8192,
        "sized_by": "room for --max-num-seqs 8 full contexts within a quarter of RAM",
    }
    return CapacityPlan(**{**fields, **changes})


def test_what_fits() -> None:
    plan = _plan()
    assert plan.kv_tokens == 65664
    # A sequence of L tokens holds L // 16 + 1 blocks (the next position too).
    assert plan.sequences_of(8192) == 8 and plan.sequences_of(1024) == 63
    text = plan.describe()
    assert text.startswith("weights 96.0 MiB on cpu; KV cache 4104 blocks of 16 = 65664 tokens")
    assert "(float16, 22.5 KiB a token, 1.4 GiB)" in text
    assert "8 sequences of the full 8192-token context or 63 of 1024 tokens" in text
    assert "at most 8 run at once" in text and "--gpu-memory-utilization" not in text


def test_a_short_context_and_a_gpu() -> None:
    text = _plan(device="cuda:0", max_model_len=512, kv_blocks=99).describe()
    assert "3 sequences of the full 512-token context (" in text and "of 1024" not in text
    assert "--gpu-memory-utilization the share of the GPU it may take." in text


def test_weight_bytes_counts_a_tied_embedding_once() -> None:
    class Model:
        embed = torch.zeros(10, 4)  # float32: 160 bytes
        lm_head = embed
        norm = torch.zeros(4, dtype=torch.bfloat16)
        layers = [{"wo": QuantLinear.from_float(torch.ones(2, 32), "Q8_0"), "bqkv": None}]

    assert weight_bytes(Model()) == 160 + 8 + 2 * 34
