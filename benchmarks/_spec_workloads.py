"""The workload classes of benchmarks/speculative.py: fixed prompts generated deterministically
(the same seed gives the same prompts on every machine), each a chat message list.

Copy-heavy classes ask for output that mostly stands in the prompt already (a file with one
name changed, a JSON document rewritten, quotes from an article, passages cited, a revised
answer); the negative controls (a story, a first-turn question) copy almost nothing.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

Messages = list[dict[str, str]]

_NOUNS = ["order", "invoice", "user", "packet", "record", "sensor", "ticket", "batch", "item"]
_VERBS = ["load", "parse", "check", "update", "merge", "send", "store", "scale", "format"]
_CITIES = ["Lyon", "Osaka", "Quito", "Perth", "Oslo", "Dakar", "Lima", "Hanoi", "Porto", "Cork"]
_NAMES = ["Ada", "Bruno", "Chen", "Dara", "Emil", "Farah", "Goran", "Hana", "Ivo", "Juno"]
_TOPICS = ["the harbour", "the old mill", "a new bridge", "the river", "the market", "the school"]
_PRODUCTS = ["a steel water bottle", "a folding bicycle", "a desk lamp", "a rain jacket"]


def _function(rng: random.Random, var: str, i: int) -> str:
    noun, verb = rng.choice(_NOUNS), rng.choice(_VERBS)
    k = rng.randint(2, 9)
    return (
        f"def {verb}_{noun}_{i}({var}, limit={k}):\n"
        f'    """{verb.capitalize()} one {noun} and return the result."""\n'
        f"    if {var} is None:\n"
        f"        return None\n"
        f"    total = 0\n"
        f"    for step in range(limit):\n"
        f"        total += {var}.{noun}_size * step\n"
        f"    return {{'{noun}': {var}, 'total': total}}\n"
    )


def code_rename(rng: random.Random) -> Messages:
    # 4-8 functions: a file of about 300-600 tokens with SmolLM2's tokenizer.
    var = rng.choice(["payload", "entry", "source", "target"])
    new = rng.choice(["data", "value", "element", "subject"])
    code = "\n\n".join(_function(rng, var, i) for i in range(rng.randint(4, 8)))
    text = (
        f"Rename the parameter `{var}` to `{new}` everywhere in this file and output the "
        f"complete file, nothing else.\n\n```python\n{code}```"
    )
    return [{"role": "user", "content": text}]


def json_rewrite(rng: random.Random) -> Messages:
    records = [
        {
            "id": 100 + i,
            "name": rng.choice(_NAMES),
            "city": rng.choice(_CITIES),
            "age": rng.randint(18, 80),
            "active": rng.random() < 0.5,
        }
        for i in range(rng.randint(8, 14))
    ]
    text = (
        'Rewrite this JSON with the key "city" renamed to "town"; keep everything else. '
        f"Output only the JSON.\n\n{json.dumps(records, indent=2)}"
    )
    return [{"role": "user", "content": text}]


def _sentence(rng: random.Random) -> str:
    who, where = rng.choice(_NAMES), rng.choice(_CITIES)
    return (
        f"{who} from {where} said that {rng.choice(_TOPICS)} would open in "
        f"{rng.randint(2025, 2031)} after {rng.randint(2, 14)} months of work."
    )


def summary_quotes(rng: random.Random) -> Messages:
    article = " ".join(_sentence(rng) for _ in range(rng.randint(8, 12)))
    text = (
        "Summarize this article in three sentences, quoting its key sentences word for word."
        f"\n\n{article}"
    )
    return [{"role": "user", "content": text}]


def rag_answer(rng: random.Random) -> Messages:
    passages = [" ".join(_sentence(rng) for _ in range(3)) for _ in range(3)]
    who = rng.choice(_NAMES)
    body = "\n\n".join(f"Passage {i + 1}: {p}" for i, p in enumerate(passages))
    text = (
        f"{body}\n\nUsing only the passages above, what did {who} say? Quote the passage "
        "sentences you use."
    )
    return [{"role": "user", "content": text}]


def revise_answer(rng: random.Random) -> Messages:
    product = rng.choice(_PRODUCTS)
    answer = " ".join(
        f"It is made in {rng.choice(_CITIES)} and it weighs {rng.randint(2, 30)} hundred grams."
        for _ in range(rng.randint(4, 7))
    )
    old, new = "weighs", "has a weight of"
    return [
        {"role": "user", "content": f"Write a short product description for {product}."},
        {"role": "assistant", "content": f"Meet {product}. {answer}"},
        {
            "role": "user",
            "content": f"Revise your answer: replace '{old}' with '{new}' and keep everything "
            "else exactly the same.",
        },
    ]


def story(rng: random.Random) -> Messages:
    a, b = rng.sample(_NAMES, 2)
    return [
        {
            "role": "user",
            "content": f"Write a short story about {a}, {b} and {rng.choice(_TOPICS)}.",
        }
    ]


def first_turn(rng: random.Random) -> Messages:
    topic = rng.choice(["learning to cook", "running", "saving money", "gardening", "sleep"])
    return [{"role": "user", "content": f"What are some tips for {topic}?"}]


CLASSES: dict[str, Callable[[random.Random], Messages]] = {
    "code_rename": code_rename,
    "json_rewrite": json_rewrite,
    "summary_quotes": summary_quotes,
    "rag_answer": rag_answer,
    "revise_answer": revise_answer,
    "story": story,
    "first_turn": first_turn,
}
COPY_HEAVY = ("code_rename", "json_rewrite", "summary_quotes", "rag_answer", "revise_answer")
CONTROLS = ("story", "first_turn")


def prompts(name: str, n: int, seed: int = 0) -> list[Messages]:
    make = CLASSES[name]
    return [make(random.Random(f"{seed}/{name}/{i}")) for i in range(n)]


def copy_fraction(prompt: list[int], output: list[int], n: int = 4) -> float:
    """Share of output tokens that complete an n-gram standing in the prompt (the tokens a
    prompt-lookup draft could have proposed)."""
    grams = {tuple(prompt[i : i + n]) for i in range(len(prompt) - n + 1)}
    text = prompt[-(n - 1) :] + output
    hits = sum(tuple(text[i : i + n]) in grams for i in range(len(output)))
    return hits / len(output) if output else 0.0
