"""A stand-in for the Hugging Face Hub (there is no Hub access here): serves model folders over
HTTP the way huggingface_hub downloads files, so ``HF_ENDPOINT=<url>`` makes a real Hub download
(``from_pretrained("org/name")`` fills ``HF_HOME`` exactly as a real download does).

    with fake_hub({"tiny/llama": folder}, host="0.0.0.0") as hub:
        hub.url          # for HF_ENDPOINT
        hub.requests     # every path asked for, in order

Answers ``/{repo}/resolve/{revision}/{file}`` (HEAD and GET, with the commit and ETag headers
huggingface_hub reads), ``/api/models/{repo}[/revision/{revision}]`` and
``/api/models/{repo}/tree/{revision}/{folder}``; 404 otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Hub:
    url: str
    repos: dict[str, Path]
    requests: list[str] = field(default_factory=list)


def _handler(hub: Hub) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, body: bytes, headers: dict[str, str], head: bool) -> None:
            self.send_response(status)
            for k, v in {"Content-Length": str(len(body)), **headers}.items():
                self.send_header(k, v)
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _answer(self, head: bool) -> None:
            path = self.path.split("?", 1)[0]
            hub.requests.append(f"{self.command} {path}")
            api = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
            resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
            if tree and tree.group(1) in hub.repos:
                folder = hub.repos[tree.group(1)] / (tree.group(3) or "")
                if not folder.is_dir() or ".." in (tree.group(3) or "").split("/"):
                    self._send(404, b"Entry not found", {"X-Error-Code": "EntryNotFound"}, head)
                    return
                root = hub.repos[tree.group(1)]
                entries = [
                    {"type": "directory" if p.is_dir() else "file", "path": p.relative_to(root).as_posix()}
                    for p in sorted(folder.iterdir())
                ]
                self._send(200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, head)
                return
            if api and api.group(1) in hub.repos:
                folder = hub.repos[api.group(1)]
                files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
                info = {
                    "id": api.group(1),
                    "modelId": api.group(1),
                    "sha": COMMIT,
                    "private": False,
                    "gated": False,
                    "disabled": False,
                    "siblings": [{"rfilename": f} for f in files],
                    "tags": ["safetensors"],
                }
                body = json.dumps(info).encode()
                self._send(200, body, {"Content-Type": "application/json"}, head)
                return
            if resolve and resolve.group(1) in hub.repos:
                file = hub.repos[resolve.group(1)] / resolve.group(3)
                if file.is_file() and ".." not in resolve.group(3).split("/"):
                    body = file.read_bytes()
                    etag = hashlib.sha256(body).hexdigest()
                    headers = {
                        "Content-Type": "application/octet-stream",
                        "ETag": f'"{etag}"',
                        "X-Repo-Commit": COMMIT,
                    }
                    self._send(200, body, headers, head)
                    return
                self._send(404, b"Entry not found", {"X-Error-Code": "EntryNotFound"}, head)
                return
            self._send(404, b"Repository not found", {"X-Error-Code": "RepoNotFound"}, head)

        def do_HEAD(self) -> None:
            self._answer(head=True)

        def do_GET(self) -> None:
            self._answer(head=False)

    return Handler


@contextlib.contextmanager
def fake_hub(repos: dict[str, Path], host: str = "127.0.0.1", url_host: str | None = None) -> Iterator[Hub]:
    """Serve ``repos`` (repo id -> folder) on a free port of ``host``; ``url_host`` is the address
    clients use (default ``host``)."""
    hub = Hub("", repos)
    server = http.server.ThreadingHTTPServer((host, 0), _handler(hub))
    hub.url = f"http://{url_host or host}:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
