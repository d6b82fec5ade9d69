"""Several models behind one port (met.server.router): two tiny models the tests write, a GGUF file
and a Hugging Face folder, served by one `met serve` and driven with the openai client: both
answer, concurrently; /v1/models lists each with its state; an unknown name is a 404; under
--max-loaded-models 1 the least recently used unloads (its engine thread ends) and reloads on
its next request with the same greedy answer; --model-idle-timeout unloads an unused model."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import openai
import pytest
from hf_reference import build_hf, save_hf, write_gguf
from server_harness import start_server

from met.server.router import scan_models_dir

ASK = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    gguf_path = write_gguf(build_hf("qwen3", seed=3), folder / "tiny-gguf.gguf", "qwen3")
    # The folder's byte-level tokenizer has 256 ids: so has its model.
    hf_path = save_hf(build_hf("qwen3", seed=4, vocab_size=256), folder / "tiny-hf")
    return folder, gguf_path, hf_path


def _greedy(client: openai.OpenAI, model: str) -> str:
    reply = client.chat.completions.create(model=model, messages=ASK, max_tokens=6, temperature=0)
    assert reply.model == model and 1 <= reply.usage.completion_tokens <= 6
    return reply.choices[0].message.content


def _states(server) -> dict[str, str]:
    listed = server.http().get("/v1/models").json()["data"]
    return {m["id"]: m["status"]["value"] for m in listed}


def _model_states(server) -> dict[str, str]:
    return {m["name"]: m["state"] for m in server.http().get("/status").json()["models"]}


def test_models_dir_finds_files_and_folders(two_models, tmp_path):
    folder, gguf_path, hf_path = two_models
    assert scan_models_dir(folder) == [gguf_path, hf_path]
    (tmp_path / "m-00001-of-00002.gguf").write_bytes(b"")
    (tmp_path / "m-00002-of-00002.gguf").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    assert [p.name for p in scan_models_dir(tmp_path)] == ["m-00001-of-00002.gguf"]


@pytest.mark.slow
def test_two_models_answer_concurrently_and_unknown_is_404(two_models):
    _, gguf_path, hf_path = two_models
    server = start_server("--model", str(gguf_path), "--model", str(hf_path))
    try:
        client = server.openai()
        assert _states(server) == {"tiny-gguf": "loaded", "tiny-hf": "unloaded"}
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            jobs = [pool.submit(_greedy, client, name) for name in ["tiny-gguf", "tiny-hf"] * 2]
            answers = [job.result() for job in jobs]
        assert answers[0] == answers[2] and answers[1] == answers[3]
        assert _states(server) == {"tiny-gguf": "loaded", "tiny-hf": "loaded"}
        with pytest.raises(openai.NotFoundError) as e:
            _greedy(client, "no-such-model")
        assert "'tiny-gguf', 'tiny-hf'" in e.value.message
        metrics = server.http().get("/metrics").text
        assert 'met_model_state{model="tiny-hf",state="loaded"} 1.0' in metrics
    finally:
        assert server.stop() == 0


@pytest.mark.slow
def test_least_recently_used_unloads_and_reloads_the_same(two_models):
    folder, _, _ = two_models
    server = start_server("--models-dir", str(folder), "--max-loaded-models", "1")
    try:
        client = server.openai()
        first = _greedy(client, "tiny-gguf")
        other = _greedy(client, "tiny-hf")
        assert _model_states(server) == {"tiny-gguf": "unloaded", "tiny-hf": "loaded"}
        assert _greedy(client, "tiny-gguf") == first
        assert _model_states(server) == {"tiny-gguf": "loaded", "tiny-hf": "unloaded"}
        status = server.http().get("/status").json()
        assert status["engine_threads"] == 1 and status["stats"]["kv_blocks_used"] == 0
        assert _greedy(client, "tiny-hf") == other
        unload = server.http().post("/models/unload", json={"model": "tiny-hf"})
        assert unload.status_code == 200 and unload.json()["status"] == "unloaded"
        assert server.http().get("/health").status_code == 200
        assert "unloading 'tiny-gguf' (making room for 'tiny-hf')" in server.logs()
    finally:
        assert server.stop() == 0


@pytest.mark.slow
def test_idle_model_unloads_and_answers_again(two_models):
    _, gguf_path, _ = two_models
    server = start_server("--model", str(gguf_path), "--model-idle-timeout", "0.5")
    try:
        client = server.openai()
        first = _greedy(client, "tiny-gguf")
        deadline = time.monotonic() + 30
        while _states(server)["tiny-gguf"] != "unloaded" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _states(server)["tiny-gguf"] == "unloaded"
        assert httpx.get(server.url + "/health").status_code == 200
        assert _greedy(client, "tiny-gguf") == first
    finally:
        assert server.stop() == 0
