"""Test helpers: the real app server on a free loopback port, and Debian's Chromium via Playwright.

    with streamlit_server(env={"ATTNVIZ_DEMO": "1"}) as server:
        server.url            # http://127.0.0.1:PORT
        server.log()          # everything the server wrote to stdout/stderr so far
        server.rss()          # resident memory of the server process, bytes

The server runs ``python -m streamlit run app.py`` as a subprocess in its own process group and
is killed (group and all) on exit. Nothing listens beyond 127.0.0.1.
"""

from __future__ import annotations

import base64
import contextlib
import json
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

import numpy as np

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
        before = self.diag_path.stat().st_mtime_ns if self.diag_path.exists() else 0
        os.kill(self.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.diag_path.exists() and self.diag_path.stat().st_mtime_ns != before:
                with contextlib.suppress(json.JSONDecodeError):
                    return json.loads(self.diag_path.read_text())
            time.sleep(0.1)
        raise TimeoutError("the server did not answer the diagnostics signal")

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
DIAG_HOOK = """
import json, os, signal, sys


def _dump(signum, frame):
    import gc

    out = {}
    models = sys.modules.get("ui.models")
    if models is not None:
        for name, cache in (("results", models.results_cache()), ("derived", models._derived())):
            out[name] = {"entries": len(cache), "mib": cache.total_bytes / 2**20}
    try:
        from streamlit.runtime import Runtime

        mgr = Runtime.instance()._session_mgr
        out["sessions_active"] = len(mgr.list_active_sessions())
        out["sessions_kept"] = len(mgr.list_sessions())
    except Exception as err:  # noqa: BLE001 - diagnostics only
        out["sessions_error"] = repr(err)
    gc.collect()
    result_type = getattr(sys.modules.get("attnviz.result"), "AttentionResult", None)
    if result_type is not None:
        out["results_alive"] = sum(1 for o in gc.get_objects() if isinstance(o, result_type))
    path = os.environ["ATTNVIZ_TEST_DIAG"]
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)


signal.signal(signal.SIGUSR1, _dump)
"""


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
# Installed once per page: counts events in one sequence, so "the last rerun request was sent
# before the last run finished" is a comparison. A rerun request is a BackMsg whose first field is
# rerun_script (field 11, wire type 2: first byte 0x5A); other messages (heartbeats) are ignored.
RUN_TRACKER_JS = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app) return null;
  if (!window.__attnvizRuns) {
    const t = window.__attnvizRuns = {seq: 0, rerunSent: -1, finished: -1, runs: 0};
    const send = WebSocket.prototype.send;
    WebSocket.prototype.send = function (data) {
      try {
        const bytes = data instanceof ArrayBuffer ? new Uint8Array(data)
          : ArrayBuffer.isView(data) ? new Uint8Array(data.buffer, data.byteOffset, data.byteLength) : null;
        if (bytes && bytes.length && bytes[0] === 0x5a) t.rerunSent = ++t.seq;
      } catch (e) {}
      return send.call(this, data);
    };
    let last = app.getAttribute('data-test-script-state');
    if (last === 'notRunning') { t.finished = ++t.seq; t.runs = 1; }
    new MutationObserver(() => {
      const now = app.getAttribute('data-test-script-state');
      if (now !== last && now === 'notRunning') { t.finished = ++t.seq; t.runs += 1; }
      last = now;
    }).observe(app, {attributes: true, attributeFilter: ['data-test-script-state']});
  }
  return window.__attnvizRuns.runs;
}"""

IDLE_JS = """after => {
  const t = window.__attnvizRuns;
  const app = document.querySelector('[data-testid="stApp"]');
  if (!t || !app || app.getAttribute('data-test-script-state') !== 'notRunning') return false;
  if (t.rerunSent > t.finished || t.runs <= after) return false;  // a rerun asked for, not done
  const busy = '[data-testid="stSkeleton"], [data-testid="stStatusWidgetRunningIcon"]';
  if (document.querySelector(busy)) return false;
  return Array.from(document.querySelectorAll('[data-testid="stPlotlyChart"]')).every(c => {
    const gd = c.querySelector('.js-plotly-plot');
    return gd && gd._fullLayout;
  });
}"""


def script_runs(page) -> int:
    """How many script runs this page has seen finish (installs the tracker on first use)."""
    page.wait_for_selector('[data-testid="stApp"]')
    return int(page.evaluate(RUN_TRACKER_JS) or 0)


def wait_idle(page, timeout_ms: int = 120_000, *, after: int | None = None) -> None:
    """Wait on conditions, never a fixed time: the script run is over, every rerun request the
    page has sent since the tracker was installed has been answered by a finished run (and, with
    ``after``, more than ``after`` runs have finished), no skeleton or running icon is left, and
    every Plotly chart is drawn. Use `reran` around an action that must cause a rerun."""
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout_ms)
    page.wait_for_function(RUN_TRACKER_JS, timeout=timeout_ms)
    page.wait_for_function(IDLE_JS, arg=-1 if after is None else after, timeout=timeout_ms)


@contextlib.contextmanager
def reran(page, timeout_ms: int = 120_000) -> Iterator[None]:
    """``with reran(page): page.click(...)``: on exit, wait until a run started after the action
    has finished and the page is idle."""
    before = script_runs(page)
    yield
    wait_idle(page, timeout_ms, after=before)


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


# -- a headless Streamlit client: one script run over the websocket, no browser ------------------
@dataclass
class Run:
    """What one script run sent back: alerts (error/warning/info bodies), Plotly figures
    (parsed JSON), exceptions, the finish status and the wall time."""

    status: str
    alerts: list[str]
    figures: list[dict]
    exceptions: list[str]
    seconds: float
    widgets: list[dict]  # {"type", "label", "options" (selectbox), "password" (text_input)}


def run_session(url: str, query: str, *, timeout: float = 180) -> Run:
    """Open a fresh session on the server, run the main page with ``query`` (a URL query string,
    as a share link carries it) and collect the elements until the run finishes."""
    return next(iter_session(url, [query], timeout=timeout))


def iter_session(url: str, queries: list[str], *, timeout: float = 180) -> Iterator[Run]:
    """One session (one websocket) that opens each query string in turn, like one visitor pasting
    one link after another; yields a `Run` per query."""
    from streamlit.proto import BackMsg_pb2, ForwardMsg_pb2
    from websockets.sync.client import connect

    ws_url = url.replace("http://", "ws://") + "/_stcore/stream"
    with connect(ws_url, subprotocols=["streamlit"], open_timeout=30, max_size=2**28) as ws:
        for query in queries:
            back = BackMsg_pb2.BackMsg()
            back.rerun_script.query_string = query
            back.rerun_script.page_script_hash = ""
            alerts_, figures, exceptions, widgets = [], [], [], []
            t0 = time.monotonic()
            ws.send(back.SerializeToString())
            while True:
                msg = ForwardMsg_pb2.ForwardMsg()
                msg.ParseFromString(ws.recv(timeout=timeout))
                kind = msg.WhichOneof("type")
                if kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
                    el = msg.delta.new_element
                    which = el.WhichOneof("type")
                    if which == "alert":
                        alerts_.append(el.alert.body)
                    elif which == "plotly_chart":
                        figures.append(json.loads(el.plotly_chart.spec))
                    elif which == "exception":
                        exceptions.append(f"{el.exception.type}: {el.exception.message}")
                    elif which in ("selectbox", "text_input", "text_area", "slider"):
                        w = getattr(el, which)
                        widgets.append(
                            {
                                "type": which,
                                "label": w.label,
                                "options": list(w.options) if which == "selectbox" else [],
                                "password": which == "text_input" and w.type == w.PASSWORD,
                            }
                        )
                elif kind == "script_finished":
                    status = ForwardMsg_pb2.ForwardMsg.ScriptFinishedStatus.Name(msg.script_finished)
                    if status != "FINISHED_EARLY_FOR_RERUN":
                        break
            yield Run(status, alerts_, figures, exceptions, time.monotonic() - t0, widgets)


def figure_array(value) -> np.ndarray:
    """A Plotly JSON array: a plain list, or a typed-array spec ``{"dtype", "bdata", "shape"}``."""
    if isinstance(value, dict) and "bdata" in value:
        arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        if shape:
            arr = arr.reshape([int(s) for s in str(shape).split(",")])
        return arr
    return np.asarray(value)
