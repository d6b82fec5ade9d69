"""The C++ CPU forward of Gemma 4's MoE (26B-A4B's kind: the dense MLP and the experts side by
side, the scaled router, experts narrower than the dense MLP; csrc/cpu/mlp_forward.cpp and
moe_forward.cpp through met.model.cpu_mlp) against the torch forward over the same Q8_0 blocks
of gemma4_fixtures' tiny model, at prefill and decode past the sliding window, greedy token for
token; and what the engine counts on from it: a prompt in chunks or whole, a row alone or batched
and on one thread or more give the same bits."""

from __future__ import annotations

import pytest
import torch
from gemma4_fixtures import WINDOW, gemma4, write_gemma4_gguf
from gguf_writing import Q
from model_fixtures import PagedRunner

from met.model.capability import cannot_run
from met.model.cpu_llama import CpuLlama
from met.models import load_model

# Both forwards quantize each matmul's input to int8 per 32-block (the C++ one K/V to fp16 too)
# and sum norms in their own orders; test_gemma4.py's measured bound against transformers.
TOL = 3e-2
STEPS = [
    [("a", list(range(3, 14)))],
    [("a", [20]), ("b", [5, 6, 7, 8, 9, 10, 11])],
    [("b", [30]), ("a", [21]), ("c", [1, 2])],
    [("a", [22]), ("b", [31]), ("c", list(range(3, 21)))],
]
pytestmark = pytest.mark.usefixtures("cpu_path")


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    path = write_gemma4_gguf(gemma4(moe=True), tmp_path_factory.mktemp("g4") / "m.gguf", Q.Q8_0)
    return load_model(path, device="cpu", weight_format="gguf")[1]


def _cpp(model, n_threads: int = 0, seed: int = 1) -> PagedRunner:
    runner = PagedRunner(model, num_blocks=48, block_size=4, seed=seed)
    runner.model = CpuLlama(model, runner.cache, n_threads)
    return runner


def test_the_model_is_the_26b_kind(blocks):
    specs, c = blocks.config.layer_specs(), blocks.config
    assert {s.mlp for s in specs} == {"dense+moe"} and {s.router for s in specs} == {"scaled"}
    dense, experts = blocks.layers[0]["w_down"], blocks.layers[0]["moe"].experts[0][1]
    assert (dense.in_features, experts.in_features, c.ffn) == (128, 32, 32)
    assert cannot_run(blocks, "cpu") is None


def test_the_cpp_forward_runs_the_moe_like_the_torch_one(blocks):
    reference, cpp = PagedRunner(blocks, num_blocks=48, block_size=4, seed=1), _cpp(blocks)
    for rows in STEPS:
        for got, want in zip(cpp.step(rows), reference.step(rows), strict=True):
            torch.testing.assert_close(got, want, atol=TOL * want.abs().max().item(), rtol=0)
            assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_greedy_decoding_picks_the_torch_forwards_tokens(blocks):
    prompt = [(5 * i) % 90 + 3 for i in range(2 * WINDOW + 3)]
    picks = {}
    for name, runner in (("torch", PagedRunner(blocks, 48, 4, seed=1)), ("cpp", _cpp(blocks))):
        tokens = [int(runner.step([("s", prompt)])[0][-1].argmax())]
        for _ in range(8):
            tokens.append(int(runner.step([("s", tokens[-1:])])[0][-1].argmax()))
        picks[name] = tokens
    assert picks["cpp"] == picks["torch"]


def test_a_prompt_in_chunks_is_the_same_bits_as_whole(blocks):
    prompt = [(7 * i) % 90 + 3 for i in range(19)]
    whole = _cpp(blocks).step([("p", prompt)])[0]
    chunked, start, parts = _cpp(blocks, seed=2), 0, []
    for end in (5, 6, 13, 19):  # decode-sized, across the window and the block boundaries
        parts.append(chunked.step([("p", prompt[start:end])])[0])
        start = end
    assert torch.equal(torch.cat(parts), whole)


def test_a_row_is_the_same_bits_alone_batched_and_on_one_thread(blocks):
    batched = _cpp(blocks)
    got = [batched.step(rows)[[name for name, _ in rows].index("a")] for rows in STEPS]
    alone = _cpp(blocks, n_threads=1, seed=5)
    for rows, want in zip(STEPS, got, strict=True):
        assert torch.equal(alone.step([r for r in rows if r[0] == "a"])[0], want)
