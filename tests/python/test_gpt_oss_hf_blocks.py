"""gpt-oss HF folders as OpenAI ships them, the experts MXFP4 `*_blocks`/`*_scales`, loaded for
the C++ forward (--device cpu --weight-format gguf): the experts stay QuantLinear MXFP4 blocks of
the folder's bytes (repacked into ggml's layout), which read back as transformers' own
dequantization bit for bit, gate and up in met's order; the C++ forward's greedy tokens against
transformers' float32 forward. The reference is the tiny model transformers builds from its
config, its experts set to transformers' dequantization of the random blocks the folder holds."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from gpt_oss_fixtures import EXPERT_WEIGHTS, gpt_oss_model
from hf_reference import Q, assert_matches_transformers, hf_logits, save_hf
from safetensors.torch import load_file, save_file
from torch import Tensor
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from met.kernels.cpu_quant import QuantLinear
from met.model.capability import cannot_run
from met.models import load_model

# As test_gpt_oss's MXFP4 file: the C++ forward's matmuls take int8 activations.
TOL_BLOCKS = 2e-2
# As OpenAI's config.json says it (transformers reads it; met reads the tensors' names).
QUANTIZATION = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}


def _random_mxfp4(gen: torch.Generator, param: Tensor) -> tuple[Tensor, Tensor]:
    """Random blocks [E, out, in / 32, 16] and E8M0 scales [E, out, in / 32] for an HF expert
    tensor [E, in, out]: every code, scales 2^-7..2^-4 (weights about N(0, 1 / fan-in) or less,
    so that the int8 activations stay within test_gpt_oss's bound)."""
    experts, width, rows = param.shape
    shape = (experts, rows, width // 32)
    blocks = torch.randint(0, 256, (*shape, 16), dtype=torch.uint8, generator=gen)
    return blocks, torch.randint(120, 124, shape, dtype=torch.uint8, generator=gen)


@pytest.fixture(scope="module")
def mxfp4_folder(tmp_path_factory) -> tuple[torch.nn.Module, Path, dict[str, Tensor]]:
    """(the reference, the folder, the blocks and scales it stores by tensor name). The other
    linear weights but the routers are rounded to Q8_0, as the load quantizes them; the routers
    scaled by 4 for top-2 margins wider than the int8 activations' noise (as test_gpt_oss)."""
    model = gpt_oss_model(rounded=Q.Q8_0)
    gen = torch.Generator().manual_seed(5)
    packed = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(EXPERT_WEIGHTS):
                blocks, scales = _random_mxfp4(gen, param)
                param.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
                packed[name + "_blocks"], packed[name + "_scales"] = blocks, scales
            elif name.endswith("mlp.router.weight"):
                param *= 4.0
    folder = save_hf(model, tmp_path_factory.mktemp("gpt_oss"))
    shard = folder / "model.safetensors"
    state = {n: t for n, t in load_file(shard).items() if not n.endswith(EXPERT_WEIGHTS)}
    save_file({**state, **packed}, shard, metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": QUANTIZATION}))
    return model, folder, packed


def _experts(model) -> list[QuantLinear | Tensor]:
    return [w for layer in model.layers for pair in layer["moe"].experts.values() for w in pair]


def test_mxfp4_experts_stay_blocks_of_the_folders_size(mxfp4_folder, caplog):
    _, folder, packed = mxfp4_folder
    with caplog.at_level(logging.INFO, logger="met.engine"):
        _, model, _ = load_model(folder, device="cpu", weight_format="gguf")
    experts = _experts(model)
    assert {(type(w), w.qtype) for w in experts} == {(QuantLinear, "MXFP4")}
    assert sum(w.nbytes for w in experts) == sum(t.numel() for t in packed.values())
    assert cannot_run(model, "cpu") is None  # the other linear weights: Q8_0 blocks
    # 4 layers x 4 experts x gate, up, down; q, k, v, o of each layer, the embedding, lm_head
    assert "48 MXFP4 weights kept as stored blocks" in caplog.text
    assert "18 float linear weights quantized to Q8_0" in caplog.text


def test_the_blocks_read_as_transformers_dequantizes_them(mxfp4_folder, caplog):
    reference, folder, _ = mxfp4_folder
    _, blocks, _ = load_model(folder, device="cpu", weight_format="gguf")
    with caplog.at_level(logging.INFO, logger="met.engine"):
        _, dense, _ = load_model(folder, device="cpu", weight_format="dequantized")
    assert "48 MXFP4 weights dequantized to float32 for the torch forward" in caplog.text
    for i, layer in enumerate(reference.model.layers):
        hf = layer.mlp.experts
        for e, (gate_up, down) in blocks.layers[i]["moe"].experts.items():
            rows = hf.gate_up_proj[e].T  # [2F, H]: gate at even rows, up at odd ones
            want = (torch.cat([rows[0::2], rows[1::2]]), hf.down_proj[e].T)  # met: gate, then up
            assert torch.equal(gate_up.dequantize(), want[0])
            assert torch.equal(down.dequantize(), want[1])
            dense_gate_up, dense_down = dense.layers[i]["moe"].experts[e]
            assert torch.equal(dense_gate_up, want[0]) and torch.equal(dense_down, want[1])


def test_the_cpp_forward_runs_the_mxfp4_folder_as_transformers(mxfp4_folder):
    reference, folder, _ = mxfp4_folder
    want = hf_logits(reference)
    forwards = assert_matches_transformers(folder, want, TOL_BLOCKS, weight_format="gguf")
    assert forwards == ["torch", "cpp"]
