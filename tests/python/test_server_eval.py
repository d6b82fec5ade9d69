"""Prompt logprobs over HTTP (echo + logprobs, vLLM's prompt_logprobs) and lm-evaluation-harness
running a local loglikelihood task and a generate-until task against a real `met serve`."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import httpx
import pytest
from server_harness import ServerProcess, start_server

PROMPT = "The capital of France is Paris. The capital of Italy is"


@pytest.fixture(scope="module")
def server():
    proc = start_server("--max-model-len", "512")
    yield proc
    assert proc.stop() == 0


def _model(server: ServerProcess) -> str:
    with server.http() as http:
        return http.get("/v1/models").json()["data"][0]["id"]


def test_echo_with_logprobs_scores_the_prompt(server: ServerProcess) -> None:
    client = server.openai()
    with server.http() as http:
        n_prompt = len(http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"])
    only = client.completions.create(
        model=_model(server), prompt=PROMPT, echo=True, logprobs=2, max_tokens=0
    ).choices[0]
    assert only.text == PROMPT and only.finish_reason == "length"
    lp = only.logprobs
    assert len(lp.tokens) == n_prompt and "".join(lp.tokens) == PROMPT
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v < 0 for v in lp.token_logprobs[1:])
    assert lp.text_offset[:2] == [0, len(lp.tokens[0])]
    # " Rome" after that prompt is the likeliest token by far; a scored continuation agrees.
    more = client.completions.create(
        model=_model(server), prompt=PROMPT, echo=True, logprobs=1, max_tokens=2, temperature=0
    ).choices[0]
    assert more.text.startswith(PROMPT) and len(more.logprobs.tokens) == n_prompt + 2
    assert more.logprobs.token_logprobs[:n_prompt] == pytest.approx(lp.token_logprobs)
    # vLLM's prompt_logprobs: token id -> logprob, rank and text, the same values.
    vllm = client.completions.create(
        model=_model(server), prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": 1}
    ).choices[0]
    entries = vllm.model_extra["prompt_logprobs"]
    assert entries[0] is None and len(entries) == n_prompt
    for entry, value, token in zip(entries[1:], lp.token_logprobs[1:], lp.tokens[1:], strict=True):
        chosen = [e for e in entry.values() if e["decoded_token"] == token]
        assert chosen and chosen[0]["logprob"] == pytest.approx(value)
        assert any(e["rank"] == 1 for e in entry.values())


def test_prompt_logprobs_on_chat_and_the_stream_cases(server: ServerProcess) -> None:
    client = server.openai()
    messages = [{"role": "user", "content": "Say hi."}]
    chat = client.chat.completions.create(
        model=_model(server), messages=messages, max_tokens=2, extra_body={"prompt_logprobs": 0}
    )
    entries = chat.model_extra["prompt_logprobs"]
    assert entries[0] is None and all(len(e) == 1 for e in entries[1:])
    assert chat.usage.prompt_tokens == len(entries)
    with server.http() as http:
        refused = http.post(
            "/v1/completions",
            json={"prompt": PROMPT, "stream": True, "prompt_logprobs": 1, "max_tokens": 2},
        )
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "prompt_logprobs"
        refused = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 0})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"
    stream = client.completions.create(
        model=_model(server), prompt=PROMPT, echo=True, logprobs=1, max_tokens=2, stream=True
    )
    chunks = list(stream)
    first = chunks[0].choices[0]
    assert first.text == PROMPT and first.logprobs.token_logprobs[0] is None
    assert "".join(first.logprobs.tokens) == PROMPT
    assert sum(len(c.choices[0].logprobs.tokens) for c in chunks[1:] if c.choices) == 2


def test_tokenizer_info(server: ServerProcess) -> None:
    info = httpx.get(server.url + "/tokenizer_info").json()
    assert info["eos_token"] and info["chat_template"]
    assert info["model_max_length"] == 512


CHOICES = [
    ("The capital of France is", ["Paris", "banana", "seventeen"], 0),
    ("Two plus two equals", ["purple", "four", "London"], 1),
    ("The sun rises in the", ["west", "ocean", "east"], 2),
    ("Water is made of hydrogen and", ["oxygen", "iron", "cheese"], 0),
]
TASK = """
task: met_tiny_{kind}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
doc_to_text: "{{{{question}}}}"
"""
MC = """output_type: multiple_choice
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
"""
GEN = """output_type: generate_until
doc_to_target: "{{' ' + choices[answer]}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
"""


def _lm_eval(server: ServerProcess, folder) -> tuple[dict, dict[str, list[dict]]]:
    """Runs the harness's CLI on the two tasks; (results, samples by task)."""
    data = folder / "tiny.jsonl"
    rows = [{"question": q, "choices": c, "answer": a} for q, c, a in CHOICES]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for kind, body in (("mc", MC), ("gen", GEN)):
        (folder / f"{kind}.yaml").write_text(TASK.format(kind=kind, data=data) + body)
    out = folder / "results"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    env["HF_DATASETS_CACHE"] = str(folder / "hf-cache")
    model_args = f"model={_model(server)},base_url={server.url}/v1/completions,num_concurrent=2"
    argv = [sys.executable, "-m", "lm_eval", "--model", "local-completions"]
    argv += ["--model_args", model_args, "--tasks", "met_tiny_mc,met_tiny_gen"]
    argv += ["--include_path", str(folder), "--output_path", str(out), "--log_samples"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]
    samples = {
        task: [json.loads(line) for f in out.rglob(f"samples_{task}_*.jsonl") for line in f.open()]
        for task in results
    }
    return results, samples


def test_lm_eval_runs_against_met(server: ServerProcess, tmp_path, default_model_path) -> None:
    pytest.importorskip("lm_eval")
    results, samples = _lm_eval(server, tmp_path)
    import met

    # Each loglikelihood the harness read from met is the offline engine's own prompt score;
    # the accuracy and exact match follow from them and from met's greedy generations.
    llm = met.LLM(model=str(default_model_path), max_model_len=512)
    try:
        correct = 0
        for sample in sorted(samples["met_tiny_mc"], key=lambda s: s["doc_id"]):
            mine = [_score(llm, a["arg_0"], a["arg_1"]) for a in sample["arguments"].values()]
            theirs = [float(r[0][0]) for r in sample["resps"]]
            assert theirs == pytest.approx(mine, abs=2e-3)
            correct += max(range(len(mine)), key=mine.__getitem__) == sample["doc"]["answer"]
        assert results["met_tiny_mc"]["acc,none"] == pytest.approx(correct / len(CHOICES))
        matched = 0
        for sample in samples["met_tiny_gen"]:
            greedy = met.SamplingParams(temperature=0.0, max_tokens=8, stop=["\n", "."])
            text = llm.generate(sample["doc"]["question"], greedy)[0].text
            assert sample["resps"][0][0] == text
            matched += text == sample["target"]
        assert results["met_tiny_gen"]["exact_match,none"] == pytest.approx(matched / len(CHOICES))
    finally:
        llm.close()


def _score(llm, context: str, continuation: str) -> float:
    """log P(continuation | context) from the offline engine's prompt logprobs, tokenized as the
    harness does (context and continuation apart)."""
    import met

    ctx = llm.tokenizer.encode(context)
    whole = ctx + llm.tokenizer.encode(continuation)
    params = met.SamplingParams(max_tokens=0, prompt_logprobs=0)
    out = llm.generate(prompt_token_ids=[whole], sampling_params=params)[0]
    return math.fsum(e.logprob for e in out.prompt_logprobs[len(ctx) :])
