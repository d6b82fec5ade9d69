"""`met run`: one-shot generation with the offline engine, streamed to stdout."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from met.commands.common import CliError, SubParsers, add_command, resolve_model_or_fail

DEFAULT_TEMPERATURE = 0.7  # a chat-friendly default; --temperature 0 gives greedy decoding
DEFAULT_MAX_TOKENS = 256


def register(subparsers: SubParsers, common: argparse.ArgumentParser) -> None:
    parser = add_command(
        subparsers,
        common,
        "run",
        "generate a completion for one prompt and stream it to stdout",
        epilog="The prompt is wrapped in the model's chat template unless --raw is given.",
    )
    parser.add_argument("prompt", help="the prompt text, or - to read it from stdin")
    add_model_arguments(parser)
    parser.add_argument("--raw", action="store_true", help="plain completion, no chat template")
    parser.add_argument("-n", type=_positive_int, default=1, help="samples to generate (default 1)")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object instead of streaming text"
    )
    parser.set_defaults(func=_run)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by `met run` and `met chat`."""
    parser.add_argument(
        "--model",
        "-m",
        help="GGUF file, model folder or user/repo[:QUANT] from the Hugging Face Hub "
        "(default: the default model)",
    )
    parser.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    parser.add_argument(
        "--temperature",
        type=float,
        default=DEFAULT_TEMPERATURE,
        help=f"sampling temperature, 0 for greedy (default {DEFAULT_TEMPERATURE})",
    )
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default 1.0)")
    parser.add_argument(
        "--max-tokens",
        type=_positive_int,
        default=DEFAULT_MAX_TOKENS,
        help=f"most tokens to generate (default {DEFAULT_MAX_TOKENS})",
    )
    parser.add_argument("--seed", type=int, help="sampling seed, for repeatable output")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def load_llm(args: argparse.Namespace) -> Any:
    """The offline engine for --model, after checking the model exists."""
    path = resolve_model_or_fail(args.model)
    from met import LLM

    return LLM(model=str(path), dtype=args.dtype)


def sampling_params(args: argparse.Namespace, seed: int | None) -> Any:
    from met import SamplingParams

    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens, seed=seed
    )
    try:
        params.validate()
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    return params


@dataclass
class Sample:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)


def stream_sample(llm: Any, params: Any, prompt: str, raw: bool, echo: bool) -> Sample:
    """Run one request, optionally echoing text to stdout as it arrives."""
    if raw:
        deltas = llm.stream(prompt, sampling_params=params)
    else:
        deltas = llm.stream(messages=[{"role": "user", "content": prompt}], sampling_params=params)
    return collect(deltas, echo)


def collect(deltas: Any, echo: bool, sample: Sample | None = None) -> Sample:
    """Fold a stream of deltas into `sample` (which keeps the text so far if interrupted)."""
    sample = sample if sample is not None else Sample()
    for delta in deltas:
        sample.text += delta.text
        sample.token_ids.extend(delta.token_ids)
        if echo and delta.text:
            sys.stdout.write(delta.text)
            sys.stdout.flush()
        if delta.finished:
            sample.finish_reason = delta.finish_reason
            sample.usage = {
                "prompt_tokens": delta.prompt_tokens,
                "completion_tokens": delta.completion_tokens,
                "cached_tokens": delta.cached_tokens,
            }
    return sample


def _run(args: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise CliError("the prompt is empty")
    llm = load_llm(args)
    samples = []
    # Samples run one after another (seed, seed+1, ...) so each can stream as it is made.
    for index in range(args.n):
        seed = None if args.seed is None else args.seed + index
        if not args.json and args.n > 1:
            print(f"--- sample {index + 1} ---")
        sample = stream_sample(llm, sampling_params(args, seed), prompt, args.raw, not args.json)
        if not args.json:
            print()
        samples.append(sample)
    if args.json:
        print(json.dumps(_as_json(samples)))
    return 0


def _as_json(samples: list[Sample]) -> dict[str, Any]:
    usage = {
        "prompt_tokens": samples[0].usage.get("prompt_tokens", 0),
        "completion_tokens": sum(s.usage.get("completion_tokens", 0) for s in samples),
        "cached_tokens": sum(s.usage.get("cached_tokens", 0) for s in samples),
    }
    return {
        "choices": [
            {
                "index": i,
                "text": s.text,
                "token_ids": s.token_ids,
                "finish_reason": s.finish_reason,
            }
            for i, s in enumerate(samples)
        ],
        "usage": usage,
    }
