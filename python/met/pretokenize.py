"""GGUF `tokenizer.ggml.pre` names, resolved as llama.cpp resolves them.

llama.cpp maps each name a converter writes to one pre-tokenizer type, and each type to a list of
split regexes applied in turn (each regex splits every piece the previous ones left, keeping both
its matches and the text between them: the `tokenizers` library's "isolated" Split). Byte-level
BPE then runs on each piece. The regexes below are llama.cpp's, except where llama.cpp rewrote
a tokenizer.json pattern for its own regex engine: there the original pattern (which `tokenizers`
runs as is) stands in its place.
"""

from __future__ import annotations

from tokenizers import Regex, pre_tokenizers

from met.model.config import ModelLoadError

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PORO = r" ?[^(\s|.,!?…。，、।۔،)]+"

# Pre-tokenizer type -> the split regexes llama.cpp applies, in order.
_SPLITS: dict[str, list[str]] = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
    "llama3": [_LLAMA3],
    "qwen2": [_QWEN2],
    "gpt2": [_GPT2],
    "starcoder": [r"\p{N}", _GPT2],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"],
    "deepseek-coder": [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
    "deepseek3": [
        r"\p{N}{1,3}",
        "[一-龥぀-ゟ゠-ヿ]+",
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
        r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ],
    "poro": [_PORO],
    "viking": [_PORO, r"\p{N}"],
    "tekken": [_TEKKEN],
    "gpt4o": [_GPT4O],
    "seed-coder": [
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    ],
    "bailingmoe": [
        r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]|\s+(?!\S)|\s+"
    ],
}

# GGUF name -> pre-tokenizer type (llama.cpp's llama-vocab.cpp). "gpt2" is met's own older
# spelling of "gpt-2", kept for files met wrote or accepted before.
_NAMES: dict[str, str] = {
    "default": "default",
    **dict.fromkeys(
        ["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0"],
        "llama3",
    ),
    **dict.fromkeys(["dbrx", "smaug-bpe", "chatglm-bpe", "glm4", "exaone4"], "llama3"),
    **dict.fromkeys(
        ["qwen2", "stablelm2", "deepseek-r1-qwen", "megrez", "hunyuan", "grok-2"], "qwen2"
    ),
    **dict.fromkeys(
        [
            "gpt-2",
            "gpt2",
            "phi-2",
            "jina-es",
            "jina-de",
            "jina-v1-en",
            "jina-v2-es",
            "jina-v2-de",
            "jina-v2-code",
            "gigachat",
            "roberta-bpe",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "a.x-4.0",
            "mellum",
        ],
        "gpt2",
    ),
    **dict.fromkeys(
        ["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"],
        "starcoder",
    ),
    "falcon": "falcon",
    "deepseek-coder": "deepseek-coder",
    "deepseek-v3": "deepseek3",
    **dict.fromkeys(["poro-chat", "bloom", "gpt3-finnish"], "poro"),
    "viking": "viking",
    "tekken": "tekken",
    **dict.fromkeys(["gpt-4o", "llama4", "minimax-m2"], "gpt4o"),
    "seed-coder": "seed-coder",
    **dict.fromkeys(["bailingmoe", "bailingmoe2", "llada-moe"], "bailingmoe"),
}
# Types whose words are looked up whole before any merge (llama.cpp's ignore_merges).
_WHOLE_WORDS = {"llama3", "tekken"}


def known_names() -> list[str]:
    return sorted(_NAMES)


def pre_type(name: str | None) -> str:
    """The pre-tokenizer type of a GGUF name; a file without one gets llama.cpp's default."""
    if name is None:
        return "default"
    kind = _NAMES.get(name)
    if kind is None:
        raise ModelLoadError(
            f"tokenizer pre-tokenizer {name!r} is not supported (llama.cpp's names are: "
            f"{', '.join(known_names())}); load the model from its Hugging Face folder instead"
        )
    return kind


def ignores_merges(kind: str) -> bool:
    return kind in _WHOLE_WORDS


def byte_level_pre(kind: str) -> pre_tokenizers.PreTokenizer:
    """The split regexes of pre-tokenizer type `kind`, then the byte-to-unicode mapping."""
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _SPLITS[kind]]
    return pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
