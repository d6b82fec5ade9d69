"""Tensor parallel over gloo on the CPU: same tokens as one process, a clear error for a model
that does not split, a hand-launched torchrun-style pair serving HTTP, and a worker's death."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from model_fixtures import (
    byte_tokenizer_json,
    random_weights,
    real_model_path,
    save_hf_folder,
    tiny_config,
)
from server_harness import ServerProcess, free_port, start_server

import met
from met.parallel.protocol import PlannedRow, pack_plan, unpack_plan
from met.parallel.shard import ShardError, check_divisible
from met.parallel.worker import Mirror, ProtocolError
from met.sampling import SamplingParams

PROMPTS = [[1, 5, 9, 33, 70, 100, 7], [1, 200, 3] * 7]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 layers, 4 heads, 2 KV heads, MLP 128, vocab 256: splits over 2 ranks."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    config = tiny_config(vocab=256)
    save_hf_folder(folder, config, random_weights(config, seed=7))
    (folder / "tokenizer.json").write_text(byte_tokenizer_json())
    return folder


def _greedy_tokens(model: Path, tp: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    # Short prefill chunks so that chunked prefill, mixed steps and batched decode all run.
    with met.LLM(str(model), dtype="float32", tensor_parallel_size=tp, max_prefill_tokens=8) as llm:
        outputs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)
    if tp > 1:  # close() sent the shutdown word: the worker it spawned exited cleanly
        assert [p.returncode for p in llm.engine._parallel.group.procs] == [0] * (tp - 1)
    return [out.token_ids for out in outputs]


def test_two_ranks_give_the_single_process_tokens(tiny_model: Path) -> None:
    assert _greedy_tokens(tiny_model, 2) == _greedy_tokens(tiny_model, 1)


def test_a_plan_travels_as_its_rows() -> None:
    rows = [PlannedRow(3, 0, 21, PROMPTS[1][:8], [4]), PlannedRow(0, 9, 7, [5], [0])]
    payload = pack_plan(rows)
    assert unpack_plan(2, payload) == rows
    with pytest.raises(ValueError, match="ends inside row 2"):
        unpack_plan(3, payload)
    with pytest.raises(ValueError, match="left over"):
        unpack_plan(1, payload)


def test_worker_mirrors_each_sequence_through_its_plans() -> None:
    mirror = Mirror(block_size=4)
    mirror.on_plan([PlannedRow(3, 0, 21, PROMPTS[1][:8], [4, 5])])  # a prompt's first chunk
    mirror.on_plan([PlannedRow(3, 8, 21, PROMPTS[1][8:], [4, 5, 6, 7, 8, 9])])  # the rest
    mirror.on_plan([PlannedRow(3, 21, 21, [9], [4, 5, 6, 7, 8, 9])])  # a decode step
    mirror.on_plan([PlannedRow(1, 16, 21, PROMPTS[1][16:], [4, 5, 6, 7, 1, 2])])  # a prefix hit
    assert mirror.lengths == {3: 22, 1: 21}
    mirror.on_free(3)
    mirror.on_free(2)  # freed before its first forward: never seen
    assert mirror.lengths == {1: 21}


def test_worker_refuses_a_row_that_does_not_follow_its_sequence() -> None:
    mirror = Mirror(block_size=4)
    mirror.on_plan([PlannedRow(2, 0, 21, PROMPTS[1][:8], [0, 1])])
    with pytest.raises(ProtocolError, match="sequence 2: a row at 12..15 after 8 positions"):
        mirror.on_plan([PlannedRow(2, 12, 21, PROMPTS[1][12:16], [0, 1, 2, 3])])
    with pytest.raises(ProtocolError, match="sequence 5: its first row starts at 6"):
        mirror.on_plan([PlannedRow(5, 6, 21, PROMPTS[1][6:10], [0, 1, 2])])
    with pytest.raises(ProtocolError, match="sequence 6: its block table ends before 8"):
        mirror.on_plan([PlannedRow(6, 0, 21, PROMPTS[1][:8], [0])])


def test_default_model_split_rules() -> None:
    from met.model.config import ModelConfig

    smollm2 = ModelConfig("llama", 30, 9, 3, 576, 64, 1536, 49152, 1e5, 8192, 1e-5)
    with pytest.raises(ShardError, match="cannot split 9 attention heads / 3 KV heads over 2"):
        check_divisible(smollm2, 2)
    check_divisible(smollm2, 3)  # the split the message offers


@pytest.mark.slow
def test_default_model_over_two_ranks_fails_before_spawning() -> None:
    path = real_model_path()
    if path is None:
        pytest.skip("the default model is not downloaded")
    with pytest.raises(ShardError, match=r"9 attention heads / 3 KV heads over 2 ranks.*1, 3"):
        met.LLM(str(path), tensor_parallel_size=2)


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _wait_exit(server: ServerProcess, within_s: float) -> int:
    try:
        return server.proc.wait(within_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"rank 0 still running {within_s}s after its worker died:\n{server.logs()}")


def test_serve_spawns_its_worker_and_exits_when_it_dies(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MET_TEST_MODEL", raising=False)
    args = ("--model", str(tiny_model), "--tensor-parallel-size", "2", "--dtype", "float32")
    server = start_server(*args)
    try:
        with server.http() as http:
            # ignore_eos: an unseeded draw from the random model may end it early otherwise.
            body = {"prompt": "hi", "max_tokens": 4, "ignore_eos": True}
            reply = http.post("/v1/completions", json=body)
            assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
        (worker,) = _children(server.proc.pid)
        os.kill(worker, signal.SIGKILL)  # while idle: the heartbeat notices
        assert _wait_exit(server, 15) != 0
        assert "tensor-parallel worker rank 1 exited with code -9" in server.logs()
    finally:
        server.stop()


def test_torchrun_ranks_serve_then_a_killed_worker_ends_the_stream(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MET_TEST_MODEL", raising=False)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = ("--model", str(tiny_model), "--tensor-parallel-size", "2", "--dtype", "float32")
    monkeypatch.setenv("RANK", "1")
    rank1 = ServerProcess(*args)  # the same command line torchrun would run on every rank
    monkeypatch.setenv("RANK", "0")
    rank0 = ServerProcess(*args)
    try:
        rank0.wait_ready()
        with rank0.http() as http:
            reply = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4})
            assert reply.status_code == 200
            body = {"prompt": "hi", "max_tokens": 240, "ignore_eos": True, "stream": True}
            with http.stream("POST", "/v1/completions", json=body) as stream:
                lines = stream.iter_lines()
                assert next(line for line in lines if line.startswith("data:"))
                rank1.proc.kill()
                rest = "\n".join(lines)
        assert "engine_dead" in rest and not rest.rstrip().endswith('"length"}]}')
        assert _wait_exit(rank0, 15) != 0
        assert "a collective with the workers failed" in rank0.logs()
        assert "); exiting" in rank0.logs()
    finally:
        rank1.stop()
        rank0.stop()
