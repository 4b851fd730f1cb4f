"""Test helper: the real app server on a free loopback port (Chromium: browser_page.py; a headless
Streamlit client: ws_client.py).

    with streamlit_server(env={"ATTNVIZ_DEMO": "1"}) as server:
        server.url            # http://127.0.0.1:PORT
        server.log()          # everything the server wrote to stdout/stderr so far
        server.rss()          # resident memory of the server process, bytes

The server runs ``python -m streamlit run app.py`` as a subprocess in its own process group and
is killed (group and all) on exit. Nothing listens beyond 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "test-output"
sys.path.append(str(ROOT / "scripts"))  # the diagnostics hook, shared with scripts/demo_soak.py
import server_diag  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log_path: Path
    diag_path: Path | None = None  # set with streamlit_server(diag=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss(self) -> int:
        """Resident memory of the server process (bytes)."""
        import psutil

        return psutil.Process(self.proc.pid).memory_info().rss

    def alive(self) -> bool:
        return self.proc.poll() is None

    def diag(self, timeout: float = 30) -> dict:
        """Ask the server (started with ``diag=True``) what it holds: live AttentionResults, the
        UI caches' entries and bytes, Streamlit sessions (active and kept after disconnect)."""
        assert self.diag_path is not None, "start the server with diag=True"
        answer = server_diag.ask(self.proc.pid, self.diag_path, timeout)
        if answer is None:
            raise TimeoutError("the server did not answer the diagnostics signal")
        return answer

    def get(self, path: str, timeout: float = 10) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(errors="replace")


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test server's environment: offline Hub, no usage stats, tests/ importable (tiny:*)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNVIZ_", "STREAMLIT_"))}
    if "ATTNVIZ_CACHE" in os.environ:
        env["ATTNVIZ_CACHE"] = os.environ["ATTNVIZ_CACHE"]
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
    )
    env.update(extra or {})
    return env


# Loaded into a test server (never the app) as sitecustomize when diag=True: SIGUSR1 writes what
# the process holds to $ATTNVIZ_TEST_DIAG.
DIAG_HOOK = server_diag.hook("ATTNVIZ_TEST_DIAG", caches="all")


def tiny_models_env() -> dict[str, str]:
    """The environment of a server that serves the tiny test models too (`tiny.register` runs in
    the server process, loaded as its sitecustomize): a page runs in a second, not a minute."""
    hook = OUTPUT / "tiny-hook"
    hook.mkdir(parents=True, exist_ok=True)
    (hook / "sitecustomize.py").write_text("import tiny\n\ntiny.register()\n")
    return {"PYTHONPATH": os.pathsep.join([str(hook), str(ROOT), str(ROOT / "tests")])}


@contextlib.contextmanager
def streamlit_server(
    script: str = "app.py",
    *,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    name: str = "server",
    startup_timeout: float = 120,
    diag: bool = False,
) -> Iterator[Server]:
    """Start ``streamlit run script`` on a free loopback port; yield once /_stcore/health is ok.

    ``diag=True`` loads `DIAG_HOOK` into the server process so that `Server.diag` works."""
    port = free_port()
    logs = OUTPUT / "server-logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    full_env = server_env(env)
    diag_path = None
    if diag:
        hook_dir = OUTPUT / "diag-hook" / name
        hook_dir.mkdir(parents=True, exist_ok=True)
        (hook_dir / "sitecustomize.py").write_text(DIAG_HOOK)
        diag_path = hook_dir / "diag.json"
        diag_path.unlink(missing_ok=True)
        full_env["PYTHONPATH"] = os.pathsep.join([str(hook_dir), full_env["PYTHONPATH"]])
        full_env["ATTNVIZ_TEST_DIAG"] = str(diag_path)
    cmd = [
        sys.executable, "-m", "streamlit", "run", script,
        "--server.address", "127.0.0.1",
        "--server.port", str(port),
        "--server.headless", "true",
        "--browser.gatherUsageStats", "false",
        "--server.fileWatcherType", "none",
        *args,
    ]  # fmt: skip
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=full_env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(f"http://127.0.0.1:{port}", proc, log_path, diag_path)
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with {proc.returncode}:\n{server.log()[-3000:]}")
            with contextlib.suppress(OSError):
                if server.get("/_stcore/health", timeout=2)[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"streamlit not healthy after {startup_timeout} s:\n{server.log()[-3000:]}"
                )
            time.sleep(0.25)
        yield server
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, then SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
