"""A local stand-in for the Hugging Face Hub on 127.0.0.1, for tests that run the real
huggingface_hub client (HF_ENDPOINT pointed here): the routes its snapshot_download calls, in
the Hub's layout and with the headers it reads.

GET /api/models/{repo}[/revision/{rev}]: the repo's id, commit sha and files; GET
/api/models/{repo}/tree/{rev}: its file tree; HEAD and GET /{repo}/resolve/{rev}/{file}: ETag,
X-Repo-Commit and Content-Length, Range answered with 206. A repo or file it lacks is a 404 with
the X-Error-Code the Hub sends. `cut` makes the next GET of a file stop after that many bytes
and drop the connection, as a network failure mid-download does; `gated` repos answer only a
request bearing their token."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_REPO = r"(?P<repo>[^/]+/[^/]+)"
_INFO = re.compile(rf"/api/models/{_REPO}(?:/revision/(?P<rev>[^/]+))?")
_TREE = re.compile(rf"/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/.*)?")
_RESOLVE = re.compile(rf"/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<file>.+)")
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


class FakeHub:
    """Serves `repos` (repo id -> {path in repo: bytes}); `requests` records (method, path,
    Range header) of every request."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        self.cut: dict[str, int] = {}
        self.gated: dict[str, str] = {}  # repo -> the token it takes
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def add(self, repo: str, files: dict[str, bytes]) -> None:
        self.repos.setdefault(repo, {}).update(files)

    def add_folder(self, repo: str, folder: Path) -> None:
        """Every file under `folder`, at its path relative to it."""
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")}
        self.add(repo, {name: data for name, data in files.items() if (folder / name).is_file()})

    def commit(self, repo: str) -> str:
        """The repo's commit sha: 40 hex digits that change with its content."""
        digest = hashlib.sha1()
        for name, data in sorted(self.repos[repo].items()):
            digest.update(name.encode() + hashlib.sha256(data).digest())
        return digest.hexdigest()

    def downloads(self) -> list[tuple[str, str | None]]:
        """(path, Range) of each file GET."""
        return [
            (path, rng)
            for method, path, rng in self.requests
            if method == "GET" and "/resolve/" in path
        ]

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args: object) -> None:
            pass  # the tests read hub.requests instead

        def do_HEAD(self) -> None:
            self._route(body=False)

        def do_GET(self) -> None:
            self._route(body=True)

        def _route(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path, self.headers.get("Range")))
            for pattern, answer in ((_TREE, self._tree), (_INFO, self._info)):
                if match := pattern.fullmatch(path):
                    return answer(match)
            if match := _RESOLVE.fullmatch(path):
                return self._file(match, body)
            self._send(404, b"{}", {"Content-Type": "application/json"})

        def _repo(self, match: re.Match) -> dict[str, bytes] | None:
            repo = hub.repos.get(match["repo"])
            rev = match["rev"]
            token = hub.gated.get(match["repo"])
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found")
            elif token is not None and self.headers.get("Authorization") != f"Bearer {token}":
                self._error(403, "GatedRepo", "Access to this gated repo is restricted")
            elif rev not in (None, "main", hub.commit(match["repo"])):
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            else:
                return repo
            return None

        def _info(self, match: re.Match) -> None:
            if (files := self._repo(match)) is not None:
                info = {
                    "id": match["repo"],
                    "sha": hub.commit(match["repo"]),
                    "siblings": [{"rfilename": name} for name in sorted(files)],
                }
                self._json(info)

        def _tree(self, match: re.Match) -> None:
            if (files := self._repo(match)) is not None:
                self._json(
                    [
                        {"type": "file", "path": name, "size": len(data), "oid": _etag(data)}
                        for name, data in sorted(files.items())
                    ]
                )

        def _file(self, match: re.Match, body: bool) -> None:
            if (files := self._repo(match)) is None:
                return
            commit = {"X-Repo-Commit": hub.commit(match["repo"])}
            data = files.get(match["file"])
            if data is None:
                return self._error(404, "EntryNotFound", "Entry not found", commit)
            headers = {**commit, "ETag": f'"{_etag(data)}"', "Accept-Ranges": "bytes"}
            status, start = 200, 0
            ranged = _RANGE.fullmatch(self.headers.get("Range") or "")
            if ranged:
                status, start = 206, int(ranged.group(1))
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            part = data[start:]
            cut = hub.cut.pop(match["file"], None) if body else None
            if cut is None:
                return self._send(status, part if body else b"", headers, len(part))
            self._send(status, part[:cut], headers, len(part))
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True

        def _error(self, status: int, code: str, message: str, extra: dict | None = None) -> None:
            headers = {"X-Error-Code": code, "X-Error-Message": message, **(extra or {})}
            self._send(status, json.dumps({"error": message}).encode(), headers)

        def _json(self, value: object) -> None:
            self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

        def _send(self, status: int, data: bytes, headers: dict, length: int | None = None) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data) if length is None else length))
            self.end_headers()
            if data:
                self.wfile.write(data)

    return Handler


def _etag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
