"""Several models behind one port: which model a request's `model` names, loading on first use,
unloading the least recently used beyond --max-loaded-models and the idle beyond
--model-idle-timeout. A request leases its model for its whole life (released by the access
middleware once the response has been sent), so a model is never unloaded under a request."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from met.server.errors import APIError
from met.server.served_model import (
    LOADED,
    LOADING,
    EngineFactory,
    LoadProgress,
    ServedModel,
    model_label,
)

if TYPE_CHECKING:
    from starlette.requests import Request

    from met.server.settings import ServerSettings
    from met.server.state import ServerState

log = logging.getLogger("met.server")

_POLL_S = 0.05  # how often a load waiting for room looks for an idle model to unload
LEASES = "met_models"  # the request scope's list of the models it leased


def model_specs(settings: ServerSettings) -> list[str | None]:
    """Every model the server may serve, in order: --model (repeated), then --models-dir's GGUF
    files (the first part of a split one) and Hugging Face folders."""
    specs: list[str | None] = [settings.engine.model, *settings.more_models]
    if settings.models_dir:
        specs += [str(p) for p in scan_models_dir(Path(settings.models_dir))]
        if specs[0] is None:
            specs = specs[1:] or [None]
    return specs


def scan_models_dir(folder: Path) -> list[Path]:
    """The models in a folder: *.gguf files (a split model by its -00001-of- part) and
    subfolders holding a config.json."""
    if not folder.is_dir():
        raise FileNotFoundError(f"--models-dir: {folder} is not a folder")
    found = []
    for path in sorted(folder.iterdir()):
        folder_model = path.is_dir() and (path / "config.json").is_file()
        first_part = "-of-" not in path.stem or "-00001-of-" in path.stem
        if folder_model or (path.suffix == ".gguf" and first_part):
            found.append(path)
    return found


class ModelRouter:
    def __init__(
        self,
        server: ServerState,
        make_engine: EngineFactory,
        engine: Any = None,
        progress: LoadProgress | None = None,
    ) -> None:
        settings = server.settings
        self.server = server
        self.max_loaded = settings.max_loaded_models
        budget = settings.models_memory_gib
        self.memory_budget = None if budget is None else int(budget * 2**30)
        self.load_timeout = settings.model_load_timeout
        specs = model_specs(settings)
        self.models: list[ServedModel] = []
        for i, spec in enumerate(specs):
            config = dataclasses.replace(settings.engine, model=spec)
            names = _names(settings, spec, i)
            first = i == 0
            self.models.append(
                ServedModel(
                    server,
                    config,
                    names,
                    make_engine,
                    engine if first else None,
                    progress if first else None,
                )
            )
        self._check_unique()
        self._room = asyncio.Lock()

    @property
    def default(self) -> ServedModel:
        return self.models[0]

    def _check_unique(self) -> None:
        seen: dict[str, str | None] = {}
        for model in self.models:
            for name in model.names if len(self.models) > 1 else []:
                if name in seen:
                    raise ValueError(
                        f"two models answer to '{name}' ({seen[name]} and {model.config.model}); "
                        "rename one of the files"
                    )
                seen[name] = model.config.model

    def find(self, requested: str | None) -> ServedModel:
        """The model a request's `model` names (none: the first); a 404 naming those served."""
        if requested is None:
            return self.default
        for model in self.models:
            if model.answers_to(requested):
                return model
        if "*" in self.default.given_names:
            return self.default
        for model in self.models:
            if not _listed_names(model):
                # Named by its file only once loaded (the default model): until then the request
                # may be asking for it, so it waits like any other (a 503 while it loads).
                model.require_ready()
        raise APIError(
            404,
            f"The model '{requested}' does not exist; this server serves "
            + ", ".join(f"'{n}'" for n in self.names()),
            param="model",
            code="model_not_found",
        )

    def names(self) -> list[str]:
        return [n for m in self.models for n in _listed_names(m)]

    async def acquire(self, requested: str | None, request: Request | None) -> ServedModel:
        """The named model, loaded (waiting for its load, bounded), leased to `request`."""
        model = self.find(requested)
        if self.server.draining:
            return model.require_ready()
        if request is not None:
            model.leases += 1
            request.scope.setdefault("state", {}).setdefault(LEASES, []).append(model)
        model.last_used = time.monotonic()
        # The first model's first load is the server's startup (met.server.lifecycle).
        if model.status != LOADED and (model.loaded_once or model is not self.default):
            async with self._room:
                await self._make_room(model)
                await model.ensure_loaded(self.load_timeout)
        model.require_ready()
        return model

    @staticmethod
    def release(model: ServedModel) -> None:
        model.leases -= 1
        model.last_used = time.monotonic()

    async def _make_room(self, model: ServedModel) -> None:
        deadline = time.monotonic() + self.load_timeout
        while True:
            held = [m for m in self.models if m is not model and m.status in (LOADED, LOADING)]
            if len(held) < self.max_loaded and self._fits(model, held):
                return
            idle = [m for m in held if m.status == LOADED and m.leases == 0]
            if idle:
                victim = min(idle, key=lambda m: m.last_used)
                await victim.unload(f"making room for '{model.name}'")
                continue
            if not held:  # alone it is over the budget: load it anyway, as the only one
                log.warning("'%s' alone is over --models-memory-gib", model.name)
                return
            if time.monotonic() > deadline:
                raise APIError(
                    503,
                    f"The loaded models are busy; '{model.name}' cannot load beside them",
                    code="model_loading",
                    headers={"Retry-After": "5"},
                )
            await asyncio.sleep(_POLL_S)

    def _fits(self, model: ServedModel, held: list[ServedModel]) -> bool:
        """Whether `model` fits the memory budget beside `held` (their weights and KV pools;
        one not loaded yet by its files' size)."""
        if self.memory_budget is None:
            return True
        return sum(m.memory_bytes() for m in held) + model.memory_bytes() <= self.memory_budget

    async def unload_idle(self, idle_s: float) -> None:
        """Unload every model unused for `idle_s` seconds (run periodically)."""
        now = time.monotonic()
        for model in self.models:
            if model.status == LOADED and model.leases == 0 and now - model.last_used > idle_s:
                async with self._room:
                    await model.unload(f"idle for {idle_s:g}s")

    async def unload(self, model: ServedModel) -> None:
        """Unload `model` once its requests have finished (llama-server's /models/unload)."""
        async with self._room:
            while model.leases:
                await asyncio.sleep(_POLL_S)
            await model.unload("asked to")

    def loaded(self) -> list[ServedModel]:
        return [m for m in self.models if m.status == LOADED]

    def listing(self, created: int) -> list[dict[str, Any]]:
        """/v1/models: every model with its state (llama-server's `status.value`), and the
        context and chat setup of those loaded."""
        out = []
        for model in self.models:
            loaded = model.status == LOADED and model.ready
            for name in _listed_names(model):
                entry: dict[str, Any] = {
                    "id": name,
                    "object": "model",
                    "created": created,
                    "owned_by": "met",
                    "status": {"value": model.status},
                }
                if loaded:
                    entry["max_model_len"] = model.engine.max_model_len
                    entry |= model.chat_setup.describe()
                out.append(entry)
        return out


def _listed_names(model: ServedModel) -> list[str]:
    """The names a model is listed under: those it was given but '*' (which accepts any), or,
    once loaded with none else, its own."""
    named = [n for n in model.given_names if n != "*"]
    if named:
        return named
    return [model.name] if model.status == LOADED and model.ready else []


def _names(settings: ServerSettings, spec: str | None, index: int) -> list[str] | None:
    # --served-model-name names the first model; every other answers to its file's name.
    if index == 0 and settings.served_model_name:
        return list(settings.served_model_name)
    label = model_label(spec)
    return [label] if label else None
