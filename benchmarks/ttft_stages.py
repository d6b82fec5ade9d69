"""Where a concurrency-1 request's first-token time goes, stage by stage, in met's own process.

For one chat request (the same short synthetic prompt as serving.py's short load, or
--prompt-len words): rendering the chat template alone, the server's encode_chat (render and
tokenize), and the engine's
first step split into the C++ forward (what LlamaForward reports) and the rest of the step
(scheduling, packing, sampling: host overhead). With --url, also the streamed TTFT of the same
request through a running server (`met serve` or any OpenAI-compatible one), so the HTTP and
server-loop share is the difference. Medians of --runs runs. Never asserts.

    PYTHONPATH=python python benchmarks/ttft_stages.py [--model FILE] [--url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx

import met
from met.commands.bench_load import synthetic_prompts
from met.model.cpu_llama import CpuLlama
from met.sampling import SamplingParams


def _in_process(llm: met.LLM, messages: list[dict], request_id: str) -> dict[str, float]:
    engine = llm.engine
    tokenizer = engine.tokenizer
    forward = engine.backend.model
    started = time.perf_counter()
    tokenizer.apply_chat_template(messages)
    rendered = time.perf_counter()
    # encode_chat renders again and tokenizes (what the server runs): render + tokenization.
    ids = tokenizer.encode_chat(messages)
    tokenized = time.perf_counter()
    kernel_before = forward.kernel_seconds if isinstance(forward, CpuLlama) else 0.0
    engine.add_request(request_id, ids, SamplingParams(temperature=0.0, max_tokens=1))
    first_step_started = time.perf_counter()
    while engine.has_work():
        engine.step()
    done = time.perf_counter()
    kernel = (forward.kernel_seconds - kernel_before) if isinstance(forward, CpuLlama) else 0.0
    return {
        "prompt_tokens": len(ids),
        "template_ms": 1e3 * (rendered - started),
        "encode_chat_ms": 1e3 * (tokenized - rendered),
        "add_request_ms": 1e3 * (first_step_started - tokenized),
        "forward_ms": 1e3 * kernel,
        "step_host_ms": 1e3 * (done - first_step_started - kernel),
        "in_process_ms": 1e3 * (done - rendered),
    }


def _http_ttft(url: str, messages: list[dict]) -> float:
    body = {"messages": messages, "max_tokens": 1, "temperature": 0.0, "stream": True}
    with httpx.Client(timeout=120) as client:
        model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
        started = time.perf_counter()
        with client.stream(
            "POST", f"{url}/v1/chat/completions", json={**body, "model": model}
        ) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                # The first chunk with text: a leading role chunk has empty content.
                if choices[0].get("delta", {}).get("content"):
                    return 1e3 * (time.perf_counter() - started)
    raise RuntimeError("the server streamed no content")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    parser.add_argument("--prompt-len", type=int, default=128, help="synthetic prompt words")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--url", default=None, help="also time the request through this server")
    parser.add_argument("--json", metavar="FILE", default=None)
    args = parser.parse_args()
    llm = met.LLM(model=args.model, max_num_seqs=1, enable_prefix_cache=False)
    prompts = synthetic_prompts(args.runs + 1, args.prompt_len, seed=1)
    runs = []
    for i, prompt in enumerate(prompts):
        figures = _in_process(llm, [{"role": "user", "content": prompt}], f"r{i}")
        if args.url:
            figures["http_ttft_ms"] = _http_ttft(args.url, [{"role": "user", "content": prompt}])
        runs.append(figures)
    llm.close()
    runs = runs[1:]  # the first pays one-time allocations
    medians = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    for key, value in medians.items():
        print(f"{key:>16}: {value:9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "medians": medians}, f, indent=2)


if __name__ == "__main__":
    main()
