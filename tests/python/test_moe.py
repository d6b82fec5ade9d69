"""met.model.moe on its own: the grouped MoE block against the reference's dense routing (both
normalisations), the expert-parallel split summing back to the whole; the C++ forward over
Q4_1 and Q4_K experts against the torch forward; the errors for the MoE layouts met does not
run."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from family_fixtures import Q, write_family_gguf, write_family_hf
from model_fixtures import PagedRunner, random_weights, tiny_config
from moe_fixtures import add_experts

from met.gguf_loader import load_gguf
from met.model.config import ModelLoadError
from met.model.cpu_llama import CpuLlama
from met.model.llama import LlamaModel
from met.model.moe import MoeBlock, keep_experts
from met.model.reference import moe_mlp, reference_logits
from met.models import load_model
from met.parallel.shard import shard_weights


def _model(norm_topk: bool, n_experts: int = 8, top_k: int = 3):
    config = tiny_config(n_experts=n_experts, n_experts_used=top_k, moe_norm_topk=norm_topk)
    weights = random_weights(config, seed=3)
    add_experts(config, weights, seed=3)
    return config, weights


def _block(config, weights: dict, layer: int = 0) -> MoeBlock:
    """Layer `layer`'s MoE block as LlamaModel builds it from (a copy of) `weights`."""
    return LlamaModel(config, dict(weights)).layers[layer]["moe"]


@pytest.mark.parametrize("norm_topk", [True, False])
def test_the_grouped_block_matches_dense_routing(norm_topk):
    config, weights = _model(norm_topk)
    h = torch.randn(37, config.hidden, generator=torch.Generator().manual_seed(0))
    want = moe_mlp(h, weights, "layers.0.", config)
    got = _block(config, weights)(h)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # Each token alone gives its row of the batch (the grouping does not mix tokens).
    alone = torch.cat([_block(config, weights)(h[t : t + 1]) for t in (0, 5, 36)])
    torch.testing.assert_close(alone, got[[0, 5, 36]], atol=1e-6, rtol=1e-6)


def test_expert_and_tensor_parallel_partials_sum_to_the_whole():
    config, weights = _model(True)
    h = torch.randn(19, config.hidden, generator=torch.Generator().manual_seed(1))
    whole = _block(config, weights)(h)
    partials = []
    for rank in range(2):
        mine = dict(weights)
        keep_experts(mine, config.n_experts, rank, 2)
        kept = {n.split(".")[3] for n in mine if ".experts." in n}
        assert kept == {str(e) for e in range(rank * 4, rank * 4 + 4)}
        partials.append(_block(config, mine)(h))
    torch.testing.assert_close(partials[0] + partials[1], whole, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="cannot split 8 experts over 3 ranks"):
        keep_experts(dict(weights), config.n_experts, 0, 3)
    # Tensor parallel instead: every rank holds every expert's slice of the expert width.
    sliced = []
    for rank in range(2):
        local, mine = shard_weights(config, dict(weights), rank, 2)
        assert mine["layers.0.experts.5.w_down"].shape == (config.hidden, config.ffn // 2)
        sliced.append(_block(local, mine)(h))
    torch.testing.assert_close(sliced[0] + sliced[1], whole, atol=1e-5, rtol=1e-5)


def test_qwen3_moe_without_renormalisation_from_an_hf_folder(tmp_path):
    folder = tmp_path / "hf"
    _, weights = write_family_hf(folder, "qwen3moe")
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(raw | {"norm_topk_prob": False}))
    config, model, _ = load_model(folder, device="cpu")
    assert config.moe_norm_topk is False
    ids = list(range(3, 20))
    want = reference_logits(config, weights, ids)
    got = PagedRunner(model, num_blocks=16, block_size=4).step([("a", ids)])[0]
    torch.testing.assert_close(got, want, atol=1e-5 * want.abs().max().item(), rtol=0)
    # Renormalised routing gives other logits: the flag is not ignored.
    renormalised = reference_logits(replace(config, moe_norm_topk=True), weights, ids)
    assert (renormalised - want).abs().max() > 1e-2 * want.abs().max()


def test_early_mixtral_files_with_one_tensor_per_expert(tmp_path):
    stacked, legacy = tmp_path / "stacked.gguf", tmp_path / "legacy.gguf"
    write_family_gguf(stacked, "mixtral")
    write_family_gguf(legacy, "mixtral", legacy_experts=True)
    want, got = load_gguf(stacked)[1], load_gguf(legacy)[1]
    assert "layers.1.experts.3.w_down" in got and want.keys() == got.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


# K-quants need rows of 256: a wider tiny model. Every format here (MXFP4: gpt-oss's experts) runs
# as stored.
K_SHAPE = {"hidden": 256, "ffn": 256, "head_dim": 64}


@pytest.mark.parametrize(
    ("qtype", "shape"),
    [(Q.Q4_1, {}), (Q.Q5_0, {}), (Q.MXFP4, {}), (Q.Q4_K, K_SHAPE)],
)
def test_the_cpp_forward_runs_quantized_experts_like_the_torch_one(tmp_path, qtype, shape):
    path = tmp_path / "moe.gguf"
    write_family_gguf(path, "qwen3moe", qtype, **shape)
    _, model, _ = load_model(path, device="cpu", weight_format="gguf")
    experts = model.layers[0]["moe"].experts
    assert {w.qtype for pair in experts.values() for w in pair} == {qtype.name}
    torch_runner = PagedRunner(model, num_blocks=32, block_size=4, seed=1)
    cpp = PagedRunner(model, num_blocks=32, block_size=4, seed=1)
    cpp.model = CpuLlama(model, cpp.cache)
    rows = [("a", list(range(3, 14))), ("b", [40, 41, 42])]
    for step in (rows, [("a", [20]), ("b", [21])]):
        for want, got in zip(torch_runner.step(step), cpp.step(step), strict=True):
            # The same blocks and matmul kernels; the C++ attention multiplies P.V in bf16, which
            # moves logits by up to 1% of the largest (measured, dense families alike).
            torch.testing.assert_close(got, want, atol=2e-2 * want.abs().max().item(), rtol=0)


def test_moe_layouts_met_does_not_run_are_one_clear_line(tmp_path):
    # Shared experts (Qwen2-MoE / DeepSeek style) in an otherwise Qwen3-MoE file.
    path = tmp_path / "shared.gguf"
    extra = {"blk.0.ffn_gate_shexp.weight": torch.zeros(32, 64)}
    write_family_gguf(path, "qwen3moe", extra=extra)
    with pytest.raises(ModelLoadError) as err:
        load_model(path, device="cpu")
    assert "blk.0.ffn_gate_shexp.weight" in str(err.value) and "\n" not in str(err.value)
    # Sigmoid routing (DeepSeek-V3's gating function) in a file that names it.
    path = tmp_path / "sigmoid.gguf"
    write_family_gguf(path, "qwen3moe", metadata={"qwen3moe.expert_gating_func": 2})
    with pytest.raises(ModelLoadError) as err:
        load_model(path, device="cpu")
    assert "gating function 2" in str(err.value) and "\n" not in str(err.value)
    # Qwen3-MoE with dense MLP layers between the sparse ones.
    folder = tmp_path / "hf"
    write_family_hf(folder, "qwen3moe")
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(raw | {"mlp_only_layers": [1]}))
    with pytest.raises(ModelLoadError) as err:
        load_model(folder, device="cpu")
    assert "mlp_only_layers" in str(err.value) and "\n" not in str(err.value)
