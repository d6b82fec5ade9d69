"""Models from the Hugging Face Hub: `met pull user/repo[:QUANT]` and `--model user/repo[:QUANT]`.

Fetched through huggingface_hub, so its cache (HF_HOME, HF_HUB_CACHE), token (HF_TOKEN, `hf auth
login`), endpoint (HF_ENDPOINT), offline switch (HF_HUB_OFFLINE) and progress bars all apply;
which files make the model is met.hub_files' choice."""

from __future__ import annotations

import glob
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from met.hub_files import Choice, choose, gguf_models, quant_of, split_parts

# A repo id as the Hub spells them (user/name of letters, digits, - _ .), then an optional :QUANT.
_REF_RE = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?::(?P<tag>[\w.-]+))?")

Say = Callable[[str], None]


class HubError(OSError):
    """A Hub model that cannot be had; the message is one line saying why."""


@dataclass(frozen=True)
class HubRef:
    repo: str
    tag: str | None = None

    def __str__(self) -> str:
        return f"{self.repo}:{self.tag}" if self.tag else self.repo


def parse_ref(name: str) -> HubRef | None:
    """`user/repo[:QUANT]` as a HubRef; None for anything else, a .gguf file name included."""
    match = _REF_RE.fullmatch(name)
    if match is None or name.lower().endswith(".gguf"):
        return None
    return HubRef(match["repo"], match["tag"])


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def pull(ref: HubRef, force: bool = False, say: Say = _stderr) -> Path:
    """Fetch the files `ref` names into the Hub cache (only what is missing, or all with
    `force`), saying in one line which were picked; offline, the cached ones. The GGUF file to
    load (a split model's first part) or the folder."""
    files, offline = _repo_files(ref)
    choice = choose(ref.repo, files, ref.tag)
    # Online the line comes before the progress bars; offline only once the cache had it, so
    # that a failure is one line.
    if offline is None:
        say(_describe(ref, choice, offline))
    folder = _download(ref, choice, force, offline)
    if offline is not None:
        say(_describe(ref, choice, offline))
    return folder / choice.gguf if choice.gguf else folder


def _describe(ref: HubRef, choice: Choice, offline: str | None) -> str:
    if choice.gguf is None:
        what = f"{ref}: a safetensors folder ({len(choice.files)} files)"
    else:
        parts = f" and its {len(choice.files) - 1} other parts" if len(choice.files) > 1 else ""
        others = f"; the repo has {', '.join(choice.quants)}" if len(choice.quants) > 1 else ""
        what = f"{ref}: {choice.gguf}{parts}{others}"
    source = f" (offline, {offline}: from the Hugging Face cache)" if offline else ""
    return f"met: {what}{source}"


def _repo_files(ref: HubRef) -> tuple[list[str], str | None]:
    """The repo's file list and None, from the Hub; offline, the cached list and why."""
    import httpx2
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    try:
        # The repo's info lists its files in one request, which fails at once when the Hub is
        # unreachable (the tree listing retries for half a minute first).
        info = HfApi().model_info(ref.repo)
        return [sibling.rfilename for sibling in info.siblings or []], None
    except GatedRepoError as exc:
        raise HubError(
            f"{ref.repo} is gated on {constants.ENDPOINT}: accept its terms there and log in "
            "(HF_TOKEN or `hf auth login`)"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise HubError(
            f"{ref.repo}: no such model on {constants.ENDPOINT} (a private one needs a token: "
            "HF_TOKEN or `hf auth login`)"
        ) from exc
    except (OfflineModeIsEnabled, httpx2.TransportError, HfHubHTTPError) as exc:
        why = _unreachable(exc)
        if why is None:
            raise HubError(f"{ref.repo}: the Hub refused the listing ({_one_line(exc)})") from exc
    return _cached_files(ref, why), why


def _unreachable(exc: Exception) -> str | None:
    """Why the Hub cannot be asked, when `exc` says it cannot (offline mode, no connection, the
    Hub down); None for any other failure."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if isinstance(exc, OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE is set"
    if isinstance(exc, httpx2.TransportError):
        return f"{constants.ENDPOINT} is unreachable ({type(exc).__name__})"
    if isinstance(exc, HfHubHTTPError) and exc.response.status_code >= 500:
        return f"{constants.ENDPOINT} answered {exc.response.status_code}"
    return None


def _cached_files(ref: HubRef, why: str) -> list[str]:
    """The repo's file list as the cache knows it: the listing the last download kept, else the
    files of the cached snapshot."""
    from huggingface_hub import get_cached_repo_tree, snapshot_download
    from huggingface_hub.errors import CachedRepoTreeNotFoundError, LocalEntryNotFoundError

    try:
        return [entry.path for entry in get_cached_repo_tree(ref.repo)]
    except CachedRepoTreeNotFoundError:
        pass
    try:
        return _files_in(Path(snapshot_download(ref.repo, local_files_only=True)))
    except LocalEntryNotFoundError as exc:
        raise HubError(f"{ref}: {why}, and it is not in the Hugging Face cache") from exc


def _download(ref: HubRef, choice: Choice, force: bool, offline: str | None) -> Path:
    import httpx2
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
    )

    try:
        folder = snapshot_download(
            ref.repo,
            allow_patterns=[glob.escape(name) for name in choice.files],
            force_download=force,
            local_files_only=offline is not None,
        )
    except IncompleteSnapshotError as exc:
        cached = _files_in(Path(exc.snapshot_path))
        lacking = ", ".join(sorted(set(choice.files) - set(cached)))
        have = ", ".join(f"{ref.repo}:{_tag(model)}" for model in gguf_models(cached))
        raise HubError(
            f"{ref}: {offline}, and the cache lacks {lacking}; cached: {have or 'no GGUF model'}"
        ) from exc
    except LocalEntryNotFoundError as exc:
        raise HubError(f"{ref}: {offline}, and it is not in the Hugging Face cache") from exc
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as exc:
        raise HubError(f"{ref}: the download failed ({_one_line(exc)}); run it again") from exc
    return Path(folder)


def _files_in(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def served_name(model: str | None, path: Path) -> str | None:
    """The name a model fetched from the Hub is served as: the user/repo[:QUANT] it was asked
    for; None for a local file or folder."""
    from huggingface_hub import constants

    ref = parse_ref(model) if model else None
    if ref is None:
        return None
    cache = Path(constants.HF_HUB_CACHE).expanduser().resolve()
    return str(ref) if Path(path).absolute().is_relative_to(cache) else None


def cached_models() -> list[tuple[str, Path, int]]:
    """(name for --model, path, bytes on disk) of each model in the Hugging Face cache: one row
    per GGUF model (user/repo:QUANT), one per other model repo (user/repo)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        cache = scan_cache_dir()
    except CacheNotFound:
        return []
    rows: dict[str, tuple[Path, int]] = {}
    for repo in sorted(cache.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        # The newest revision first, so its row wins over an older one's of the same name.
        for revision in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True):
            root = revision.snapshot_path
            sizes = {
                f.file_path.relative_to(root).as_posix(): f.size_on_disk for f in revision.files
            }
            models = gguf_models(list(sizes))
            if not models:
                rows.setdefault(repo.repo_id, (root, revision.size_on_disk))
            for model in models:
                parts = split_parts(model)
                if all(part in sizes for part in parts):
                    rows.setdefault(
                        f"{repo.repo_id}:{_tag(model)}", (root / model, sum(map(sizes.get, parts)))
                    )
    return [(name, path, size) for name, (path, size) in rows.items()]


def _tag(model: str) -> str:
    """The tag that asks for a GGUF model: its quant, else its file name."""
    return quant_of(model) or Path(model).stem
