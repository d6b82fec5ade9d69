"""Shared fixtures: the default model file (pulled once if missing) and free local ports."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest


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
