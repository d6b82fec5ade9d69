"""The C++ CPU forward of the hybrid families (Gated DeltaNet layers, gated attention, partial
RoPE, a sigmoid-gated shared expert: met.model.cpu_llama over csrc/cpu/deltanet_forward.cpp)
against the torch forward over the same Q8_0 blocks, and what the engine counts on from it:
batch and thread invariance, a prompt split at multiples of 64 positions giving the same bits,
verify rows' state snapshots that restore to what decoding would have left, and clear errors."""

from __future__ import annotations

import pytest
import torch
from gguf_writing import Q
from hybrid_fixtures import build, write_gguf
from model_fixtures import PagedRunner

from met.kernels.cpu_quant import QuantLinear
from met.model import capability
from met.model.cpu_llama import CpuLlama
from met.model.linear import RowParts
from met.models import load_model

ARCHS = ["qwen35", "qwen35moe", "qwen3next"]
# The torch forward shares the matmul kernels but not the norms' and conv's float sums: a 1e-7
# difference that moves an int8 activation by one step grows to ~1e-2 of the logits over the
# layers (test_cpu_model.py measures the same without shared reductions on plain models).
TOL = 3e-2
STEPS = [
    [("a", list(range(3, 14)))],
    [("a", [20]), ("b", [5, 6, 7, 8, 9, 10, 11])],
    [("b", [30]), ("a", [21]), ("c", [1, 2])],
    [("a", [22]), ("b", [31]), ("c", list(range(3, 80)))],
]
pytestmark = pytest.mark.usefixtures("cpu_path")


@pytest.fixture(scope="module", params=ARCHS)
def hybrid_file(request, tmp_path_factory):
    arch = request.param
    return write_gguf(build(arch), tmp_path_factory.mktemp(arch) / "m.gguf", arch, Q.Q8_0)


@pytest.fixture(scope="module")
def blocks(hybrid_file):
    return load_model(hybrid_file, device="cpu", weight_format="auto")[1]


def _cpp(model, n_threads: int = 0, seed: int = 1) -> PagedRunner:
    runner = PagedRunner(model, num_blocks=48, block_size=4, seed=seed)
    runner.model = CpuLlama(model, runner.cache, n_threads)
    return runner


def _assert_cpp_matches_torch(model) -> None:
    assert capability.cannot_run(model, "cpu") is None
    reference = PagedRunner(model, num_blocks=48, block_size=4, seed=1)
    cpp = _cpp(model)
    for rows in STEPS:
        for got, ref in zip(cpp.step(rows), reference.step(rows), strict=True):
            torch.testing.assert_close(got, ref, atol=TOL * ref.abs().max().item(), rtol=0)


def test_the_cpp_forward_runs_hybrids_like_the_torch_one(blocks):
    _assert_cpp_matches_torch(blocks)


def test_a_row_is_the_same_bits_alone_batched_and_on_one_thread(blocks):
    batched = _cpp(blocks)
    got = [batched.step(rows)[[name for name, _ in rows].index("a")] for rows in STEPS]
    alone = _cpp(blocks, n_threads=1, seed=5)
    for rows, want in zip(STEPS, got, strict=True):
        assert torch.equal(alone.step([r for r in rows if r[0] == "a"])[0], want)


def test_a_prompt_split_at_64_positions_is_the_same_bits(blocks):
    prompt = [(7 * i) % 90 + 3 for i in range(150)]
    whole = _cpp(blocks).step([("p", prompt)])[0][-1]
    split = _cpp(blocks, seed=2)
    split.step([("p", prompt[:64])])
    assert torch.equal(split.step([("p", prompt[64:])])[0][-1], whole)
    # Chunks end at multiples of 64 positions wherever a step starts: 96 + 54 tokens run
    # 96..127 and 128..149 as 96 + 32 + 22 does.
    ends = []
    for cuts in ((96, 150), (96, 128, 150)):
        runner, start = _cpp(blocks, seed=len(cuts)), 0
        for end in cuts:
            last = runner.step([("p", prompt[start:end])])[0][-1]
            start = end
        ends.append(last)
    assert torch.equal(ends[0], ends[1])


def _forward(runner: PagedRunner, name: str, tokens: list[int], **state) -> torch.Tensor:
    """One row of `tokens` for sequence `name` with the given state arguments."""
    (start,) = runner.reserve([(name, tokens)])
    runner.state_slots.setdefault(name, len(runner.state_slots))
    table, bs, n = runner.tables[name], runner.cache.block_size, len(tokens)
    positions = [start + i for i in range(n)]
    return runner.model.forward(
        runner.cache,
        torch.tensor(tokens),
        torch.tensor(positions),
        torch.tensor([table[p // bs] * bs + p % bs for p in positions]),
        torch.tensor([table], dtype=torch.int32),
        torch.tensor([runner.lens[name]], dtype=torch.int32),
        torch.tensor([0, n], dtype=torch.int32),
        torch.arange(n),
        state_slots=torch.tensor([runner.state_slots[name]]),
        **state,
    )


def test_a_verify_row_restores_to_what_decoding_leaves(blocks):
    """A verify row of 4 tokens, then the state put back to after its first 2: the same state
    and next logits as decoding those 2 one at a time."""
    prompt, drafts = list(range(3, 20)), [40, 41, 42, 43]
    decoded = _cpp(blocks)
    decoded.step([("s", prompt)])
    for token in drafts[:2]:
        decoded.step([("s", [token])])
    verified = _cpp(blocks)
    verified.step([("s", prompt)])
    _forward(verified, "s", drafts, verify_rows=torch.tensor([1]))
    cache, slot = verified.cache, verified.state_slots["s"]
    cache.state.restore(slot, 2)
    verified.lens["s"] -= 2
    want = decoded.cache.state
    assert torch.equal(cache.state.conv[:, slot], want.conv[:, decoded.state_slots["s"]])
    assert torch.equal(cache.state.delta[:, slot], want.delta[:, decoded.state_slots["s"]])
    assert torch.equal(verified.step([("s", [50])])[0], decoded.step([("s", [50])])[0])


def test_checkpoints_hold_the_state_the_torch_forward_keeps(blocks):
    """A prefill row writes its state as of positions 16 and 40 into checkpoints 1 and 0: what
    the torch forward writes (up to float sums' order), the last one the
    row's final state bit for bit; a checkpoint outside a prefill row is refused."""
    prompt = [(7 * i) % 90 + 3 for i in range(40)]
    marks = torch.tensor([[0, 16, 1], [0, 40, 0]])
    runners = [PagedRunner(blocks, num_blocks=48, block_size=4, seed=1), _cpp(blocks)]
    for runner in runners:
        runner.cache.state.keep_checkpoints(2)
        _forward(runner, "p", prompt, state_checkpoints=marks)
    (torch_state, cpp_state) = (r.cache.state for r in runners)
    slot = runners[1].state_slots["p"]
    assert torch.equal(cpp_state.ckpt_conv[0], cpp_state.conv[:, slot])
    assert torch.equal(cpp_state.ckpt_delta[0], cpp_state.delta[:, slot])
    for name in ("ckpt_conv", "ckpt_delta"):
        want = getattr(torch_state, name)
        # One prefill: only float sums' order differs (measured 1e-6 of the largest).
        torch.testing.assert_close(
            getattr(cpp_state, name), want, atol=1e-4 * want.abs().max(), rtol=0
        )
    with pytest.raises(ValueError, match="state checkpoint 0: .*inside a prefill row"):
        _forward(runners[1], "q", prompt[:8], state_checkpoints=torch.tensor([[0, 9, 0]]))


def test_bad_state_slots_are_clear_errors(blocks):
    runner = _cpp(blocks)
    runner.state_slots = {"a": 0, "b": 0}
    with pytest.raises(ValueError, match="state slot 0: one per row, distinct"):
        runner.step([("a", [1, 2]), ("b", [3])])
    runner.state_slots = {"a": 99}
    with pytest.raises(ValueError, match="state slot 99"):
        runner.step([("a", [1])])


def test_projections_in_two_formats_stay_apart_and_run_as_stored(hybrid_file):
    """A file may keep the small beta / alpha projections in another format than q/k/v and z:
    the four then stay apart (RowParts) and the C++ forward reads each as stored."""
    model = load_model(hybrid_file, device="cpu", weight_format="auto")[1]
    for i in model.recurrent_layers:
        mixer = model.layers[i]["deltanet"]
        fused, s = mixer.w_in, mixer.shape
        bounds = [0, s.conv_dim, s.conv_dim + s.value_width, fused.out_features - s.v_heads]
        parts = [
            QuantLinear(fused.blocks[a:b].clone(), fused.qtype, b - a, fused.in_features)
            for a, b in zip(bounds, [*bounds[1:], fused.out_features], strict=True)
        ]
        parts[2:] = [QuantLinear.from_float(p.dequantize(), "Q4_0") for p in parts[2:]]
        mixer.w_in = RowParts(parts)
    _assert_cpp_matches_torch(model)
