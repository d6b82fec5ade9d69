"""Expert parallel over gloo on the CPU, on a tiny random Qwen3-MoE (4 experts, 2 a token): two
ranks of two whole experts each give the one-process tokens, as does plain tensor parallelism
(every expert sliced); the split's rules; and `met serve` chatting over two expert ranks until
a killed rank ends the stream with a clear error."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import openai
import pytest
import torch
from family_fixtures import family_model, write_family_gguf
from met_cli_support import run_met
from server_harness import start_server
from test_tp import _children, _wait_exit

import met
from met.config import EngineConfig
from met.engine.capacity import weight_bytes
from met.model.llama import LlamaModel
from met.parallel.experts import ExpertSplitError, check_expert_split, describe_split
from met.parallel.shard import shard_weights
from met.sampling import SamplingParams
from met.server.settings import SettingsError, load_settings

# Inside the fixture's 105-token vocabulary; the second prompt spans several prefill chunks.
PROMPTS = [[1, 5, 9, 33, 70, 100, 7], [1, 90, 3] * 7]
SPLIT_LINE = (
    "expert parallel over 2 ranks: 4 experts, 2 whole experts a rank (rank 0: 0-1, rank 1: 2-3), "
    "router replicated; attention 2 of 4 heads a rank (tensor parallel)"
)


@pytest.fixture(scope="module")
def moe_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-moe") / "tiny-moe.gguf"
    # An LM head of its own: with the tied embedding this tiny model's greedy choice is the
    # input token again whatever its MLPs add, which no expert split could change.
    write_family_gguf(path, "qwen3moe", tie_embeddings=False)
    return path


def _greedy(model: Path, tp: int, ep: bool = False) -> list[tuple[list[int], list[float]]]:
    """Each prompt's greedy tokens and their logprobs."""
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=0)
    options = {"tensor_parallel_size": tp, "enable_expert_parallel": ep, "max_prefill_tokens": 8}
    with met.LLM(str(model), dtype="float32", **options) as llm:
        outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)
    if ep:
        assert llm.engine.split == SPLIT_LINE
    if tp > 1:  # close() sent the shutdown word: the worker exited cleanly
        assert [p.returncode for p in llm.engine._parallel.group.procs] == [0] * (tp - 1)
    return [(out.token_ids, [lp.logprob for lp in out.outputs[0].logprobs]) for out in outputs]


def test_expert_ranks_and_sliced_experts_give_the_single_process_tokens(moe_file: Path) -> None:
    alone = _greedy(moe_file, 1)
    for split in (_greedy(moe_file, 2, ep=True), _greedy(moe_file, 2)):
        assert [tokens for tokens, _ in split] == [tokens for tokens, _ in alone]
        # Only the order of float32 sums differs (the all-reduce, the sliced matmuls).
        for (_, logprobs), (_, expected) in zip(split, alone, strict=True):
            assert logprobs == pytest.approx(expected, abs=1e-4)


def test_a_rank_keeps_its_whole_experts_and_the_router() -> None:
    config, weights = family_model("qwen3moe", 256)
    local, mine = shard_weights(config, dict(weights), rank=1, world=2, expert_parallel=True)
    experts = sorted({n.split(".")[3] for n in mine if n.startswith("layers.0.experts.")})
    assert experts == ["2", "3"] and local.n_experts == 4 and local.ffn == config.ffn
    for name in ("layers.0.experts.3.w_down", "layers.0.router", "embed"):
        assert torch.equal(mine[name], weights[name])
    assert torch.equal(mine["layers.0.wq"], weights["layers.0.wq"][64:])  # heads 2-3 of 4
    assert (local.n_heads, local.n_kv_heads) == (2, 1)
    # The capacity plan counts the router and the experts a rank holds (and the model's fused
    # per-head Q/K norm scale, [heads + KV heads, head_dim] a layer).
    held = sum(t.numel() * t.element_size() for t in mine.values())
    qk_scales = config.n_layers * (2 + 1) * config.head_dim * 4
    assert weight_bytes(LlamaModel(local, mine)) == held + qk_scales


def test_expert_parallel_refusals(moe_file: Path) -> None:
    moe, _ = family_model("qwen3moe", 256)
    with pytest.raises(ExpertSplitError, match=r"cannot split 4 experts over 3 ranks.*allows 2, 4"):
        check_expert_split(moe, 3)
    dense, _ = family_model("qwen3", 256)
    with pytest.raises(ExpertSplitError, match="this qwen3 model is dense, it has no experts"):
        check_expert_split(dense, 2)
    with pytest.raises(SettingsError, match="needs --tensor-parallel-size N > 1"):
        load_settings(["--enable-expert-parallel"], env={})
    settings = load_settings(["--enable-expert-parallel", "--tensor-parallel-size", "2"], env={})
    assert settings.engine.enable_expert_parallel
    with pytest.raises(ExpertSplitError, match="needs --tensor-parallel-size N > 1"):
        met.LLM(str(moe_file), enable_expert_parallel=True)
    assert describe_split(moe, 2, False) == (
        "tensor parallel over 2 ranks: attention 2 of 4 heads a rank, every expert's MLP width "
        "split 2 ways"
    )
    assert EngineConfig().enable_expert_parallel is False


def test_a_dense_model_with_the_flag_fails_before_spawning(tmp_path: Path) -> None:
    path = tmp_path / "qwen3.gguf"
    write_family_gguf(path, "qwen3")
    with pytest.raises(ExpertSplitError, match="dense, it has no experts to split"):
        met.LLM(str(path), tensor_parallel_size=2, enable_expert_parallel=True)


def test_serve_chats_over_expert_ranks_and_a_killed_rank_ends_the_stream(
    moe_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MET_TEST_MODEL", raising=False)
    server = start_server(
        *("--model", str(moe_file), "--tensor-parallel-size", "2", "--enable-expert-parallel")
    )
    try:
        assert SPLIT_LINE in server.logs()
        client = server.openai()
        messages = [{"role": "user", "content": "hello"}]
        reply = client.chat.completions.create(
            model="tiny-moe", messages=messages, max_tokens=4, extra_body={"ignore_eos": True}
        )
        assert reply.usage.completion_tokens == 4 and reply.choices[0].finish_reason == "length"
        # A long completion, streamed: its first text arrives long before the last token.
        body = {"ignore_eos": True}
        stream = client.completions.create(
            model="tiny-moe", prompt="hello", max_tokens=200, stream=True, extra_body=body
        )
        next(chunk for chunk in stream if chunk.choices and chunk.choices[0].text)
        (worker,) = _children(server.proc.pid)
        os.kill(worker, signal.SIGKILL)
        with pytest.raises(openai.APIError, match="The engine stopped") as failed:
            for _ in stream:
                pass
        assert failed.value.code == "engine_dead"
        assert _wait_exit(server, 15) != 0
        logs = server.logs()
        # Whichever rank 0 saw first: the worker's exit status, or its collective failing.
        causes = ("tensor-parallel worker rank 1 exited with code -9", "a collective with the")
        assert any(cause in logs for cause in causes) and "); exiting" in logs, logs
    finally:
        server.stop()


def test_doctor_starts_the_expert_ranks_and_says_the_split(moe_file: Path) -> None:
    args = ("--model", str(moe_file), "--tensor-parallel-size", "2", "--enable-expert-parallel")
    result = run_met("doctor", *args, timeout=300)
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["ok", "capacity"])
    note = " ".join(line.strip() for line in lines[at + 1 : -1])
    assert note.startswith(SPLIT_LINE + ". Each rank: weights "), result.stdout + result.stderr
