"""`met chat`: an interactive multi-turn chat with a local model in the terminal."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from met.commands.common import SubParsers, add_command
from met.commands.run import Sample, add_model_arguments, collect, load_llm, sampling_params

HELP = "commands: /reset clears the conversation, /exit (or Ctrl+D) leaves"


def register(subparsers: SubParsers, common: argparse.ArgumentParser) -> None:
    parser = add_command(
        subparsers,
        common,
        "chat",
        "chat with a local model in the terminal",
        epilog=HELP,
    )
    add_model_arguments(parser)
    parser.add_argument("--system", help="a system prompt that starts every conversation")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    llm = load_llm(args)
    print(f"met chat - {HELP}", file=sys.stderr)
    history = _fresh_history(args.system)
    turn = 0
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        text = line.strip()
        if text == "/exit":
            return 0
        if text == "/reset":
            history = _fresh_history(args.system)
            print("(conversation cleared)", file=sys.stderr)
            continue
        if not text:
            continue
        history.append({"role": "user", "content": text})
        seed = None if args.seed is None else args.seed + turn
        turn += 1
        reply = _answer(llm, history, sampling_params(args, seed))
        history.append({"role": "assistant", "content": reply})


def _answer(llm: Any, history: list[dict[str, str]], params: Any) -> str:
    deltas = llm.stream(messages=history, sampling_params=params)
    sample = Sample()
    try:
        collect(deltas, echo=True, sample=sample)
    except KeyboardInterrupt:
        # Ctrl+C stops this answer, not the session; closing the stream aborts the request, and
        # the history keeps what was said so far.
        deltas.close()
        print(" (stopped)", end="")
    print()
    return sample.text


def _fresh_history(system: str | None) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}] if system else []
