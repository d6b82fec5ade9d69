"""Which files of a Hugging Face Hub repo make the model `user/repo[:QUANT]` names.

A GGUF repo holds one file (or one split set) per quantization; the tag picks one as llama-server
does: the tag matched case-insensitively in the .gguf file names, Q4_K_M without a tag, else the
first. A safetensors repo needs the files of a Hugging Face folder. Pure functions over the
repo's file list, so the same choice is made online (the Hub's listing) and offline (the cached
one)."""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_QUANT = "Q4_K_M"
# llama.cpp's gguf-split names: model-00001-of-00003.gguf.
SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_QUANT_RE = re.compile(
    r"(?<![a-z0-9])((?:ud-)?(?:i?q\d(?:_[a-z0-9]+)*|tq\d_\d|b?f(?:16|32)|mxfp4(?:_moe)?))(?![a-z0-9])",
    re.IGNORECASE,
)
# What met.hf_loader and met.tokenizer read from a folder (weights, config, tokenizer, chat
# template, generation defaults); the rest of a repo (other formats, README, images) is left.
_FOLDER_FILES = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
}


class HubFilesError(OSError):
    """The repo lacks what was asked for; the message names what it has."""


@dataclass(frozen=True)
class Choice:
    """The repo files to fetch and the one to load (a GGUF file, its first part, or None for the
    folder); `quant` is the picked file's tag and `quants` every tag the repo has."""

    files: list[str]
    gguf: str | None = None
    quant: str | None = None
    quants: tuple[str, ...] = ()


def quant_of(filename: str) -> str | None:
    """The quantization tag in a GGUF file name (the last one: Q4_K_M in x-Q4_K_M.gguf)."""
    found = _QUANT_RE.findall(filename.rsplit("/", 1)[-1])
    return found[-1].upper() if found else None


def gguf_models(files: list[str]) -> list[str]:
    """The repo's GGUF models: single files and first parts of split sets, not projectors."""
    models = []
    for name in sorted(files):
        if not name.lower().endswith(".gguf") or "mmproj" in name.lower():
            continue
        split = SPLIT_RE.search(name)
        if split is None or int(split.group(1)) == 1:
            models.append(name)
    return models


def split_parts(first: str) -> list[str]:
    """Every part of the split set whose first part is `first` ([first] when not split)."""
    split = SPLIT_RE.search(first)
    if split is None:
        return [first]
    prefix, count = first[: split.start()], split.group(2)
    return [f"{prefix}-{i:05d}-of-{count}.gguf" for i in range(1, int(count) + 1)]


def choose(repo: str, files: list[str], tag: str | None) -> Choice:
    """What `repo[:tag]` names among `files`, or HubFilesError naming what the repo has."""
    models = gguf_models(files)
    if models:
        return _choose_gguf(repo, files, models, tag)
    if tag is not None:
        raise HubFilesError(
            f"{repo} has no GGUF files, so no quant {tag}; ask for {repo} (its safetensors)"
        )
    folder = [f for f in files if _folder_file(f)]
    if "config.json" not in folder or not any(f.endswith(".safetensors") for f in folder):
        raise HubFilesError(
            f"{repo} has neither GGUF files nor safetensors weights with a config.json; "
            f"its files: {_sample(files)}"
        )
    return Choice(files=sorted(folder))


def _choose_gguf(repo: str, files: list[str], models: list[str], tag: str | None) -> Choice:
    quants = tuple(dict.fromkeys(q for q in map(quant_of, models) if q))
    wanted = tag or DEFAULT_QUANT
    pattern = re.compile(rf"(?<![a-z0-9]){re.escape(wanted)}(?![a-z0-9_])", re.IGNORECASE)
    # An exact tag (Q4_K_M) before one it ends (UD-Q4_K_M), then by name.
    matches = sorted(
        (m for m in models if pattern.search(m.rsplit("/", 1)[-1])),
        key=lambda m: (quant_of(m) != wanted.upper(), m),
    )
    if not matches and tag is not None:
        what = ", ".join(quants) if quants else _sample(models)
        raise HubFilesError(f"{repo} has no {tag} GGUF file; it has {what}")
    picked = matches[0] if matches else models[0]
    parts = split_parts(picked)
    missing = [p for p in parts if p not in files]
    if missing:
        raise HubFilesError(f"{repo}: {picked} is split, but the repo lacks {_sample(missing)}")
    return Choice(files=parts, gguf=picked, quant=quant_of(picked), quants=quants)


def _folder_file(name: str) -> bool:
    return "/" not in name and (
        name in _FOLDER_FILES or name.endswith((".safetensors", ".safetensors.index.json"))
    )


def _sample(names: list[str], most: int = 8) -> str:
    shown = ", ".join(names[:most])
    return shown + (f", ... ({len(names) - most} more)" if len(names) > most else "") or "none"
