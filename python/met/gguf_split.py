"""A GGUF model split by llama.cpp's gguf-split (model-00001-of-00003.gguf, ...) read as one file:
the first part carries the metadata, every part carries some of the tensors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gguf import GGUFReader

from met.hub_files import SPLIT_RE
from met.model.config import ModelLoadError


class SplitGGUF:
    """The parts as one reader: the first part's metadata fields, every part's tensors (each a
    view of its own part's memory map); `parts` pairs each part's path with its reader."""

    def __init__(self, parts: list[tuple[Path, GGUFReader]]) -> None:
        self.parts = parts
        self.fields = parts[0][1].fields
        self.tensors = [tensor for _, reader in parts for tensor in reader.tensors]


def parts_of(reader: GGUFReader | SplitGGUF, path: Path) -> list[tuple[Path, GGUFReader]]:
    """(path, reader) of each file the model's tensors lie in."""
    return reader.parts if isinstance(reader, SplitGGUF) else [(path, reader)]


def join_parts(
    reader: GGUFReader, path: Path, open_part: Callable[[Path], GGUFReader]
) -> GGUFReader | SplitGGUF:
    """`reader` itself for a whole file; for a split model's first part, every part joined."""
    count = int(_field(reader, "split.count", 1))
    if count <= 1:
        return reader
    number = int(_field(reader, "split.no", 0)) + 1
    if number != 1:
        raise ModelLoadError(
            f"{path}: part {number} of a model split in {count}; pass its first part "
            "(-00001-of-...), the others are read with it"
        )
    name = SPLIT_RE.search(path.name)
    if name is None:
        raise ModelLoadError(
            f"{path}: the first of {count} parts, but not named -00001-of-{count:05d}.gguf, so "
            "the other parts cannot be found; keep gguf-split's names"
        )
    prefix = path.name[: name.start()]
    parts = [(path, reader)]
    for i in range(2, count + 1):
        part = path.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf")
        if not part.is_file():
            raise ModelLoadError(f"{path}: part {part.name} is missing; download every part")
        parts.append((part, open_part(part)))
    joined = SplitGGUF(parts)
    expected = int(_field(reader, "split.tensors.count", len(joined.tensors)))
    if len(joined.tensors) != expected:
        raise ModelLoadError(
            f"{path}: the {count} parts hold {len(joined.tensors)} tensors, the first says "
            f"{expected}; a part belongs to another model, download it again"
        )
    return joined


def _field(reader: GGUFReader, key: str, default: Any) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()
