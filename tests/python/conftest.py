"""Shared fixtures: the default model file (pulled once if missing), free local ports, and the
CPU kernel paths (scalar, avx2, avx512, amx, and amx on emulated tiles) a test runs once on each."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

CPU_PATHS = ("scalar", "avx2", "avx512", "amx", "amx-emulated")


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The model the slow tests run: $MET_TEST_MODEL, else the default (pulled if missing)."""
    override = os.environ.get("MET_TEST_MODEL")
    if override:
        return Path(override)
    from met.models import resolve_model

    return resolve_model(None)


@pytest.fixture
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(params=CPU_PATHS)
def cpu_path(request: pytest.FixtureRequest):
    """Runs the test on one kernel path (as MET_CPU_ISA would force it), skipped where this CPU
    cannot take it, so a path the author's CPU never took is still covered on a CPU that does.
    On the amx paths every matmul takes tiles (from 1 row, not 16: the tests' batches are small);
    "amx-emulated" runs the amx path's tile kernels on scalar-emulated tiles, so a CPU without
    AMX still tests their packing, blocking and epilogue."""
    from met import _core

    before = _core.cpu.cpu_path()
    path = "amx" if request.param == "amx-emulated" else request.param
    _core.cpu.set_amx_emulation(request.param == "amx-emulated")
    _core.cpu.set_amx_min_rows(1)
    try:
        reason = _core.cpu.path_support()[path]
        if reason:
            pytest.skip(f"{request.param}: {reason}")
        _core.cpu.set_cpu_path(path)
        yield request.param
    finally:
        _core.cpu.set_amx_emulation(False)
        _core.cpu.set_amx_min_rows(16)
        _core.cpu.set_cpu_path(before)


@pytest.fixture(scope="session")
def agent_proc():
    """One `met serve` on the default model for the Anthropic / Responses end-to-end modules."""
    from agent_clients import agent_server

    proc = agent_server()
    yield proc
    assert proc.stop() == 0


@pytest.fixture(scope="session")
def claude(agent_proc):
    from agent_clients import claude_client

    return claude_client(agent_proc)


@pytest.fixture(scope="session")
def oai(agent_proc):
    from agent_clients import openai_client

    return openai_client(agent_proc)
