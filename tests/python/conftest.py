"""Shared fixtures: the default model file (pulled once if missing), free local ports, and the
CPU kernel paths (scalar, avx2, avx512, amx) a test runs once on each."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

CPU_PATHS = ("scalar", "avx2", "avx512", "amx")


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
    cannot take it, so a path the author's CPU never took is still covered on a CPU that does."""
    from met import _core

    reason = _core.cpu.path_support()[request.param]
    if reason:
        pytest.skip(f"MET_CPU_ISA={request.param}: {reason}")
    before = _core.cpu.cpu_path()
    _core.cpu.set_cpu_path(request.param)
    try:
        yield request.param
    finally:
        _core.cpu.set_cpu_path(before)
