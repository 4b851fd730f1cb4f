"""Test helpers: the real app server on a free loopback port, and Debian's Chromium via Playwright.

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
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log_path: Path

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


@contextlib.contextmanager
def streamlit_server(
    script: str = "app.py",
    *,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    name: str = "server",
    startup_timeout: float = 120,
) -> Iterator[Server]:
    """Start ``streamlit run script`` on a free loopback port; yield once /_stcore/health is ok."""
    port = free_port()
    logs = OUTPUT / "server-logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
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
            env=server_env(env),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(f"http://127.0.0.1:{port}", proc, log_path)
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


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """One headless Debian Chromium (never a downloaded one); yields a Playwright Browser."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} is missing: apt-get install chromium (scripts/install.sh --dev does)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


# -- page helpers --------------------------------------------------------------------------------
APP_READY_JS = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app) return false;
  const running = document.querySelector('[data-testid="stStatusWidget"]');
  return !running || !/Running|Stop/.test(running.innerText);
}"""


def wait_idle(page, timeout_ms: int = 120_000, settle_ms: int = 600) -> None:
    """Wait until the script run is over (no 'Running…' status widget), twice, to skip reruns."""
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout_ms)
    for _ in range(2):
        page.wait_for_timeout(settle_ms)
        page.wait_for_function(APP_READY_JS, timeout=timeout_ms)


def tick_labels(page) -> list[str]:
    """Every axis tick label text in every Plotly chart on the page (SVG <text> nodes)."""
    return page.eval_on_selector_all(
        ".js-plotly-plot g.xtick text, .js-plotly-plot g.ytick text", "els => els.map(e => e.textContent)"
    )


CHARTS_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => {
  const full = gd._fullData || [];
  const one = full.length === 1 ? full[0] : null;
  return {
    title: (gd._fullLayout && gd._fullLayout.title && gd._fullLayout.title.text) || '',
    traces: full.length,
    x: one && one.x ? Array.from(one.x) : null,
    y: one && one.y ? Array.from(one.y) : null,
    z: one && one.z ? Array.from(one.z, row => Array.from(row)) : null,
  };
})"""


def charts(page) -> list[dict]:
    """Each Plotly chart on the page: title, trace count and, for single-trace charts, x/y/z."""
    return page.evaluate(CHARTS_JS)


def alerts(page) -> list[str]:
    """Texts of st.error / st.warning / st.exception boxes on the page."""
    return page.eval_on_selector_all(
        '[data-testid="stAlert"], [data-testid="stException"]', "els => els.map(e => e.innerText)"
    )
