"""The chat page at `/`: static files shipped in the package, no build step, nothing fetched from
elsewhere (the page talks only to this server's /v1 routes)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from starlette.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
# The page may load and call nothing but this server: no CDN, no fonts, no analytics.
_POLICY = "default-src 'self'; img-src 'self' data:; base-uri 'none'; frame-ancestors 'none'"


async def _index() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"Content-Security-Policy": _POLICY})


def install_webui(app: FastAPI) -> None:
    app.add_api_route("/", _index, methods=["GET"], include_in_schema=False)
    app.mount("/webui", StaticFiles(directory=STATIC), name="webui")
