"""The capability table (met.model.capability): each family's row, one refusal line per cell that
says no, the refusal at load of a model the C++ forward cannot run, and `met doctor --model`
printing the row."""

from __future__ import annotations

import pytest
from family_fixtures import FAMILIES, write_family_gguf
from gemma_fixtures import write_gemma_gguf
from met_cli_support import run_met
from model_fixtures import tiny_config

from met.gguf_loader import open_gguf, read_config
from met.kernels.cpu_quant import QuantLinear
from met.model import capability
from met.model.capability import FORWARDS, capability_row, missing, refusal
from met.model.config import ModelLoadError
from met.model.families import LayerSpec
from met.models import load_model

# What the CUDA forward lacks per family (the other two run them all).
CUDA_LACKS = {
    "qwen2": [],
    "qwen3": [capability.HEAD_QK_NORM],
    "qwen3moe": [capability.HEAD_QK_NORM, capability.MOE],
    "mixtral": [capability.MOE],
    "phi3": [capability.ROPE_MAGNITUDE],
}
GEMMA = ("gemma2", "gemma3")


def _config(tmp_path, family: str):
    path = tmp_path / f"{family}.gguf"
    if family in GEMMA:
        write_gemma_gguf(path, family)
    else:
        write_family_gguf(path, family)
    return path, read_config(open_gguf(path), path)


@pytest.mark.parametrize("family", sorted(FAMILIES) + list(GEMMA))
def test_each_cell_that_says_no_is_one_line_naming_the_feature_and_who_runs_it(tmp_path, family):
    _, config = _config(tmp_path, family)
    label = "llama" if family == "mixtral" else family  # Mixtral's GGUF files are llama ones
    row = capability_row(config)
    assert row.startswith(f"{label} [") and "\n" not in row
    for forward in FORWARDS:
        lacking, line = missing(config, forward), refusal(config, forward)
        if not lacking:
            assert line is None and f"{forward} yes" in row
            continue
        assert line.startswith(f"{label}: {FORWARDS[forward]} does not implement ")
        assert all(feature in line for feature in lacking) and "\n" not in line
        assert line.endswith("; the torch forward runs it (--weight-format dequantized)")
        assert f"{forward} no ({', '.join(lacking)})" in row
    assert missing(config, "torch") == missing(config, "cpu") == []
    if family in CUDA_LACKS:
        assert missing(config, "cuda") == CUDA_LACKS[family]
    else:  # Gemma: its norms, GeLU, scaled embeddings and sliding layers at least
        assert {capability.POST_NORMS, capability.GELU, capability.SLIDING} <= set(
            missing(config, "cuda")
        )


def test_a_recurrent_layer_is_refused_by_the_cuda_forward_only() -> None:
    config = tiny_config()
    config.layers = [LayerSpec(mixer="recurrent"), LayerSpec()]
    assert refusal(config, "torch") is None and refusal(config, "cpu") is None
    assert refusal(config, "cuda") == (
        f"llama: {FORWARDS['cuda']} does not implement recurrent layers; the torch forward "
        "runs it (--weight-format dequantized)"
    )


def test_a_model_the_cpp_forward_lacks_a_feature_of_is_refused_at_load(tmp_path, monkeypatch):
    path, _ = _config(tmp_path, "qwen3")
    lacking = capability.IMPLEMENTS["cpu"] - {capability.HEAD_QK_NORM}
    monkeypatch.setitem(capability.IMPLEMENTS, "cpu", lacking)
    with pytest.raises(ModelLoadError) as err:
        load_model(path, device="cpu", weight_format="gguf")
    assert str(err.value) == (
        f"{path}: qwen3: the C++ CPU forward does not implement per-head Q/K norms; the torch "
        "forward runs it (--weight-format dequantized)"
    )
    # Left to choose, the loader keeps no blocks and the engine runs the torch forward.
    _, model, _ = load_model(path, device="cpu", weight_format="auto")
    assert not isinstance(model.layers[0]["wqkv"], QuantLinear)
    assert capability.cannot_run(model, "cpu") is not None


def test_doctor_with_a_model_prints_its_capability_row(tmp_path) -> None:
    path, config = _config(tmp_path, "qwen3")
    result = run_met("doctor", "--model", str(path), timeout=300)
    line = next(x for x in result.stdout.splitlines() if x.split()[:2] == ["ok", "capability"])
    assert line.split(None, 2)[2] == capability_row(config)
    assert capability_row(config) == (
        "qwen3 [per-head Q/K norms]: torch yes; cpu yes; cuda no (per-head Q/K norms)"
    )
