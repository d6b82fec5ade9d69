"""Each family met runs, from a tiny random GGUF (quantized and F32) and an HF folder: the paged
forwards (C++ over GGUF blocks, torch over the same or dense weights), prompts chunked and
batched, against met.model.reference's plain dense forward of that family; greedy tokens the same
alone and in a batch; the family's chat template through met's template engine."""

from __future__ import annotations

import gguf
import pytest
import torch
from family_fixtures import FAMILIES, Q, write_family_gguf, write_family_hf
from gguf_writing import finish
from model_fixtures import assert_forwards_match

import met
from met.gguf_loader import load_gguf
from met.model.config import ModelLoadError
from met.model.reference import reference_logits
from met.models import load_model

# Tolerances on logits, as a share of the largest |logit| (~50 with these random weights). Float
# weights agree with the reference up to float32 summation order (measured 2e-7). A Q8_0 file is
# checked against the reference over its own dequantized weights: the quantized matmul's int8
# activations move logits by up to 0.7% of that (measured), and every argmax must still agree.
TOL = {"f32": 1e-5, "hf": 1e-5, "q8_0": 1.5e-2}
SEQS = {"a": list(range(3, 17)), "b": [40, 41, 42, 43, 44, 45, 46, 47, 48]}
# Chunked prefill and batching: a's prompt in three chunks, b's in two, sharing steps.
STEPS = [
    [("a", SEQS["a"][:5])],
    [("a", SEQS["a"][5:11]), ("b", SEQS["b"][:4])],
    [("b", SEQS["b"][4:]), ("a", SEQS["a"][11:])],
]


def _source(tmp_path, family: str, kind: str):
    if kind == "hf":
        config, weights = write_family_hf(tmp_path / family, family)
        return tmp_path / family, config, weights
    path = tmp_path / f"{family}-{kind}.gguf"
    config, weights = write_family_gguf(path, family, Q.F32 if kind == "f32" else Q.Q8_0)
    return path, config, weights


@pytest.mark.parametrize("kind", ["q8_0", "f32", "hf"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_paged_forwards_match_the_dense_reference(tmp_path, family, kind):
    path, config, weights = _source(tmp_path, family, kind)
    loaded_config, _, _ = load_model(path, device="cpu", weight_format="dequantized")
    arch = config.architecture if kind == "hf" else FAMILIES[family]["arch"]
    assert loaded_config.architecture == arch
    if kind == "q8_0":
        config, weights = load_gguf(path)
    want = {name: reference_logits(config, weights, seq) for name, seq in SEQS.items()}
    names = assert_forwards_match(path, STEPS, want, TOL[kind])
    assert names == (["torch", "cpp"] if kind == "q8_0" else ["torch"])


@pytest.mark.parametrize("weight_format", ["gguf", "dequantized"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_alone_and_batched_and_the_chat_template(tmp_path, family, weight_format):
    path = tmp_path / f"{family}.gguf"
    write_family_gguf(path, family)
    llm = met.LLM(model=str(path), device="cpu", weight_format=weight_format, max_prefill_tokens=5)
    try:
        greedy = met.SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        prompts = [[5, 6, 7, 8, 9, 10, 11], [30, 31, 32], [50, 51, 52, 53, 54, 55, 56, 57, 58]]
        alone = [llm.generate(prompt_token_ids=[p], sampling_params=greedy)[0] for p in prompts]
        batch = llm.generate(prompt_token_ids=prompts, sampling_params=greedy)
        assert [o.token_ids for o in alone] == [o.token_ids for o in batch]
        messages = [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "<think>\nhm\n</think>\n\nhello"},
            {"role": "user", "content": "world"},
        ]
        text = llm.tokenizer.apply_chat_template(messages, enable_thinking=False)
        assert text == FAMILIES[family]["rendered"]
        out = llm.chat(messages, met.SamplingParams(temperature=0.0, max_tokens=4))[0]
        plain = llm.tokenizer.apply_chat_template(messages)
        assert plain == text.removesuffix("<think>\n\n</think>\n\n")
        ids = llm.tokenizer.encode_chat(messages)
        assert llm.tokenizer.decode(ids, skip_special=False) == plain
        assert out.usage["prompt_tokens"] == len(ids)
    finally:
        llm.close()


def test_an_unsupported_architecture_or_layer_tensor_is_one_clear_line(tmp_path):
    path = tmp_path / "odd.gguf"
    w = gguf.GGUFWriter(str(path), "rwkv7")
    w.add_block_count(1)
    finish(w)
    with pytest.raises(ModelLoadError) as err:
        load_model(path, device="cpu")
    assert "'rwkv7'" in str(err.value) and "\n" not in str(err.value)
    # A qwen3 file with a layer tensor met would not apply (a MoE router here).
    path = tmp_path / "router.gguf"
    write_family_gguf(path, "qwen3", extra={"blk.0.ffn_gate_inp.weight": torch.zeros(4, 64)})
    with pytest.raises(ModelLoadError) as err:
        load_model(path, device="cpu")
    assert "blk.0.ffn_gate_inp.weight" in str(err.value) and "\n" not in str(err.value)
