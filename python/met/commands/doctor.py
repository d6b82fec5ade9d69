"""`met doctor`: check the installation and say how to fix each problem found."""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from met.commands.common import SubParsers, add_command, human_bytes, resolve_model_or_fail
from met.server.settings import DEVICES, DTYPES, KV_CACHE_DTYPES, WEIGHT_FORMATS

MIN_FREE_MEMORY = 2 * 1024**3  # the default model with its KV cache needs about this much


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    note: str = ""  # a paragraph printed under the line


def register(subparsers: SubParsers, common: argparse.ArgumentParser) -> None:
    parser = add_command(
        subparsers, common, "doctor", "check Python, torch, the C++ core, GPUs and the model"
    )
    parser.add_argument(
        "--model",
        "-m",
        help="also load this model (GGUF file, folder or user/repo[:QUANT]) and show its "
        "capacity plan",
    )
    # The flags of `met serve` that size the plan, so that their effect can be tried here.
    for flag, kind in (
        ("--max-num-seqs", int),
        ("--max-model-len", int),
        ("--kv-cache-blocks", int),
        ("--gpu-memory-utilization", float),
        ("--tensor-parallel-size", int),
    ):
        parser.add_argument(flag, type=kind, help="as for met serve (with --model)")
    parser.add_argument(
        "--enable-expert-parallel",
        action="store_true",
        default=None,
        help="as for met serve (with --model and --tensor-parallel-size: starts the ranks)",
    )
    for flag, choices in (
        ("--kv-cache-dtype", KV_CACHE_DTYPES),
        ("--dtype", DTYPES),
        ("--device", DEVICES),
        ("--weight-format", WEIGHT_FORMATS),
    ):
        parser.add_argument(flag, choices=choices, help="as for met serve (with --model)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    probes = list(PROBES)
    if args.model is not None:
        probes.append(("capability", lambda: _capability(args)))
        probes.append(("capacity", lambda: _capacity(args)))
    checks = [_safely(name, probe) for name, probe in probes]
    width = max(len(check.name) for check in checks)
    for check in checks:
        status = "ok     " if check.ok else "problem"
        line = f"{status}  {check.name:<{width}}  {check.detail}"
        if not check.ok and check.fix:
            line += f"  -> {check.fix}"
        print(line)
        if check.note:
            print(textwrap.fill(check.note, 100, initial_indent="    ", subsequent_indent="    "))
    problems = sum(not check.ok for check in checks)
    print(f"{problems} problem(s) found" if problems else "all checks passed")
    return 1 if problems else 0


def _safely(name: str, probe: Callable[[], Check]) -> Check:
    # One broken probe must not hide the report of the others.
    try:
        return probe()
    except Exception as exc:
        return Check(
            name, False, f"check failed: {type(exc).__name__}: {exc}", "reinstall: pip install -e ."
        )


def _python() -> Check:
    version = platform.python_version()
    ok = sys.version_info >= (3, 10)
    return Check("python", ok, version, "" if ok else "install Python 3.10 or newer")


def _torch() -> Check:
    try:
        torch = importlib.import_module("torch")
    except ImportError as exc:
        return Check("torch", False, f"not importable ({exc})", "pip install 'torch>=2.2,<3'")
    return Check("torch", True, torch.__version__)


def _core() -> Check:
    try:
        core = importlib.import_module("met._core")
    except ImportError as exc:
        fix = "pip install -e . (or scripts/dev-build.sh for a development build)"
        return Check("met._core", False, f"not importable ({exc})", fix)
    has_cuda = getattr(core, "has_cuda", None)
    built = "with CUDA" if callable(has_cuda) and has_cuda() else "without CUDA"
    try:
        kernels = core.cpu.cpu_path()
    except RuntimeError:  # a bad MET_CPU_ISA: the "cpu path" check reports it
        kernels = "see cpu path"
    return Check("met._core", True, f"built {built}; CPU kernels: {kernels}")


def _cpu_path(core) -> str:
    """The kernel path in use (MET_CPU_ISA, else the default: the fastest this CPU runs),
    whether it is the default, what its matmul runs (on amx: tiles from 16 rows, the same dots
    on VNNI registers below) and why any other path is not available here (for amx also a
    kernel refusing tile data)."""
    path = core.cpu.cpu_path()
    default = core.cpu.default_path()
    support = core.cpu.path_support()
    unsupported = ", ".join(f"{name}: {why}" for name, why in support.items() if why)
    chosen = "default" if path == default else f"forced by MET_CPU_ISA; the default is {default}"
    detail = f"{path} path ({chosen}; matmul {core.cpu.matmul_kernel()})"
    return detail + (f"; not here: {unsupported}" if unsupported else "")


def _cpu_kernels() -> Check:
    core = importlib.import_module("met._core")
    try:
        return Check("cpu path", True, _cpu_path(core))
    except RuntimeError as exc:  # a MET_CPU_ISA this CPU cannot take
        return Check("cpu path", False, str(exc), "unset MET_CPU_ISA or name a supported path")


def _gpus() -> Check:
    torch = importlib.import_module("torch")
    if not torch.cuda.is_available():
        return Check("gpus", True, "none visible to torch; met runs on the CPU")
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    core = _core_has_cuda()
    fix = "" if core else "rebuild met._core with CUDA to use the GPU kernels"
    return Check("gpus", core, ", ".join(names), fix)


def _core_has_cuda() -> bool:
    try:
        core = importlib.import_module("met._core")
    except ImportError:
        return False
    has_cuda = getattr(core, "has_cuda", None)
    return bool(callable(has_cuda) and has_cuda())


def _model() -> Check:
    from met import models

    path = models.default_model_path()
    if path.exists():
        return Check("default model", True, str(path))
    return Check("default model", False, f"missing ({path})", "met pull")


def _model_path(args: argparse.Namespace) -> Path:
    """--model's file or folder, resolved once for both probes (a Hub model is asked for once)."""
    if getattr(args, "model_path", None) is None:
        args.model_path = resolve_model_or_fail(args.model)
    return args.model_path


def _capability(args: argparse.Namespace) -> Check:
    """The model's row of the capability table (met.model.capability): its family's features
    and which forward runs it, read from the file's metadata alone."""
    from met.gguf_loader import open_gguf, read_config
    from met.hf_loader import is_hf_folder, read_hf_config
    from met.model.capability import capability_row

    path = _model_path(args)
    config = read_hf_config(path) if is_hf_folder(path) else read_config(open_gguf(path), path)
    return Check("capability", True, capability_row(config))


def _capacity(args: argparse.Namespace) -> Check:
    """Load the model as `met serve` would and say what fits (met.engine.capacity)."""
    from met.config import EngineConfig
    from met.engine.core import EngineCore

    sizing = ("max_num_seqs", "max_model_len", "kv_cache_blocks", "gpu_memory_utilization")
    choices = ("kv_cache_dtype", "dtype", "device", "weight_format")
    split = ("tensor_parallel_size", "enable_expert_parallel")
    values = {name: getattr(args, name) for name in (*sizing, *choices, *split)}
    config = EngineConfig(
        model=str(_model_path(args)),
        **{name: value for name, value in values.items() if value is not None},
    )
    core = EngineCore(config)  # with --tensor-parallel-size, the other ranks start and stop too
    try:
        plan = core.capacity
    finally:
        core.shutdown()
    note = plan.describe() if core.split is None else f"{core.split}. Each rank: {plan.describe()}"
    return Check("capacity", True, str(core.model_path), note=note)


def _memory() -> Check:
    available = _available_ram()
    detail = f"{human_bytes(available)} RAM available"
    torch = importlib.import_module("torch")
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        detail += f", GPU {human_bytes(free)} free of {human_bytes(total)}"
    ok = available >= MIN_FREE_MEMORY
    return Check("memory", ok, detail, "" if ok else "close other programs or use a smaller model")


def _available_ram() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


PROBES: list[tuple[str, Callable[[], Check]]] = [
    ("python", _python),
    ("torch", _torch),
    ("met._core", _core),
    ("cpu path", _cpu_kernels),
    ("gpus", _gpus),
    ("default model", _model),
    ("memory", _memory),
]
