"""Starting the ranks of a tensor-parallel engine and the collectives they share.

Launch: `met serve --tensor-parallel-size N` (or `met.LLM(tensor_parallel_size=N)`) on one
machine spawns ranks 1..N-1 itself as `python -m met.parallel.worker` children, with the same
environment torchrun would give them. Under torchrun (RANK and WORLD_SIZE set, MASTER_ADDR and
MASTER_PORT naming rank 0's machine) every process runs the same command and nothing is
spawned: rank 0 serves, the others enter the worker loop. torch.distributed's env:// rendezvous
does the rest: gloo on CPUs, NCCL on GPUs.

Setup: rank 0 loads its shard first (a model that does not divide fails before anything is
spawned), then the group forms, rank 0 broadcasts the engine config, resolved model path and
KV-cache geometry, every worker loads its shard, and a barrier ends startup. Setup collectives
use MET_TP_SETUP_TIMEOUT_S (default 600 s, loading can be slow); while rank 0 waits in them it
also watches the workers it spawned, so one that dies is reported at once, not at the timeout.

Serving collectives run on a second group whose timeout is per rank: MET_TP_TIMEOUT_S on rank 0
(default 30 s), so a hung or unreachable worker fails the engine instead of hanging it; a week
on the workers, which legitimately wait as long as rank 0 is idle (an offline LLM between calls)
and learn of rank 0's death from its closed connections anyway.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from met.parallel import protocol
from met.parallel.launch import launched_rank

log = logging.getLogger("met.parallel")

_WORKER_WAIT = timedelta(days=7)
_REAP_S = 5.0  # how long a spawned worker gets to exit after the shutdown word
T = TypeVar("T")


class TpError(RuntimeError):
    """A rank of the tensor-parallel group died, timed out or could not start."""


def _seconds(name: str, default: float) -> timedelta:
    raw = os.environ.get(name, "")
    try:
        return timedelta(seconds=float(raw)) if raw else timedelta(seconds=default)
    except ValueError:
        raise TpError(f"{name}: expected seconds, got {raw!r}") from None


class Group:
    """This process's link to the other ranks; rank 0 sends, the workers receive."""

    def __init__(self, rank: int, device: torch.device, procs: list[subprocess.Popen]) -> None:
        self.rank = rank
        self.device = device  # where collective tensors live: NCCL needs them on the GPU
        self.procs = procs  # workers this process spawned (rank 0)
        self.serving: Any = None

    # --- rank 0 ---
    def check_workers(self) -> None:
        for rank, proc in enumerate(self.procs, start=1):
            code = proc.poll()
            if code is not None:
                raise TpError(f"tensor-parallel worker rank {rank} exited with code {code}")

    def send(self, head: Tensor, payload: Tensor | None = None) -> None:
        self.check_workers()
        self._collective(dist.broadcast, head.to(self.device), src=0, group=self.serving)
        if payload is not None:
            self._collective(dist.broadcast, payload.to(self.device), src=0, group=self.serving)

    def ping(self) -> None:
        """A round trip through every rank: a dead or stuck worker fails it."""
        self.send(protocol.header(protocol.Kind.PING))
        self.all_reduce(torch.zeros(1, device=self.device))

    # --- every rank ---
    def receive(self) -> tuple[list[int], Tensor | None]:
        head = torch.empty(protocol.HEADER_LEN, dtype=torch.int64, device=self.device)
        dist.broadcast(head, src=0, group=self.serving)
        values = head.tolist()
        if not values[3]:
            return values, None
        payload = torch.empty(values[3], dtype=torch.int64, device=self.device)
        dist.broadcast(payload, src=0, group=self.serving)
        return values, payload

    def all_reduce(self, partial: Tensor) -> Tensor:
        self._collective(dist.all_reduce, partial, group=self.serving)
        return partial

    def _collective(self, op: Callable, *args: Any, **kwargs: Any) -> None:
        try:
            op(*args, **kwargs)
        except RuntimeError as exc:
            if self.rank != 0:
                raise
            self.check_workers()  # a spawned worker's exit code says more than the socket error
            raise TpError(f"tensor parallel: a collective with the workers failed: {exc}") from exc

    def close(self, clean: bool) -> None:
        """After the shutdown word (clean) or a failure: reap or stop the spawned workers."""
        deadline = time.monotonic() + (_REAP_S if clean else 0.0)
        for proc in self.procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if dist.is_initialized():
            dist.destroy_process_group()


def start_rank0(world: int, device: torch.device, setup: dict[str, Any]) -> Group:
    """Spawn (or join, under torchrun) the other ranks, send them `setup`, wait for them."""
    launched = launched_rank()
    if launched is None:
        port = _free_port()
        procs = _spawn_workers(world, port)
        init_method = f"tcp://127.0.0.1:{port}"
    elif launched != (0, world):
        raise TpError(
            f"tensor parallel: this process is rank {launched[0]} of {launched[1]} (RANK, "
            f"WORLD_SIZE) but --tensor-parallel-size is {world}; they must agree"
        )
    else:
        procs, init_method = [], "env://"
    group = Group(0, device, procs)
    try:
        _while_alive(group, "joining", lambda: _init(device, init_method, 0, world))
        dist.broadcast_object_list([setup], src=0, device=_object_device(device))
        _while_alive(group, "loading its shard", dist.barrier)
        group.serving = dist.new_group(timeout=_seconds("MET_TP_TIMEOUT_S", 30.0))
    except BaseException:
        group.close(clean=False)
        raise
    return group


def join_worker(rank: int, world: int) -> tuple[Group, dict[str, Any]]:
    """A worker's half of start_rank0's first steps: join, then receive the setup."""
    device = _rank_device()
    _init(device, "env://", rank, world)
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0, device=_object_device(device))
    return Group(rank, device, []), box[0]


def finish_worker_setup(group: Group) -> None:
    dist.barrier()
    group.serving = dist.new_group(timeout=_WORKER_WAIT)


def _init(device: torch.device, init_method: str, rank: int, world: int) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = _seconds("MET_TP_SETUP_TIMEOUT_S", 600.0)
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world, timeout=timeout
    )


def _rank_device() -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
    torch.cuda.set_device(local % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def _object_device(device: torch.device) -> torch.device | None:
    return device if device.type == "cuda" else None


def _while_alive(group: Group, what: str, call: Callable[[], T]) -> T:
    """Run a blocking setup step in a thread while watching the spawned workers: one that dies
    ends the wait at once instead of at the setup timeout."""
    result: list[Any] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(call())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=target, name=f"met-tp-{what}", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
        try:
            group.check_workers()
        except TpError as exc:
            raise TpError(f"{exc} while {what} (its log above says why)") from None
    if failure:
        raise TpError(f"tensor parallel: startup failed while {what}: {failure[0]}") from failure[0]
    return result[0]


def _spawn_workers(world: int, port: int) -> list[subprocess.Popen]:
    package_root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    procs = []
    for rank in range(1, world):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            PYTHONPATH=path,
        )
        command = [sys.executable, "-m", "met.parallel.worker"]
        # Its own session: a Ctrl-C meant for the server must not reach the workers, which
        # rank 0 stops with the shutdown word once it has drained.
        procs.append(
            subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        )
    return procs


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
