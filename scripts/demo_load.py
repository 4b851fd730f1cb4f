"""Load a public demo server the way a shared link does: N visitors at once over Streamlit's
websocket (no browser), some leaving while they wait, some editing their text, some on Explain
and the Head atlas; then say whether the queue drained.

    python scripts/demo_load.py                 # starts `streamlit run app.py` with ATTNVIZ_DEMO=1
    python scripts/demo_load.py --visitors 16 --timeout 240

Loopback only and bounded: the server it starts listens on 127.0.0.1; ``--url`` must name a
loopback address; at most 64 visitors; every wait has a deadline (``--timeout`` for the whole
run). Reports: each kind's waits, the last visitor's wait (the longest of those who stayed),
the server's peak resident memory, the queue's state after the load (a fresh visitor's run and
the gate's log line) and the load average. Figures from a run: docs/robustness.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_VISITORS = 64
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
WORDS = [
    "river",
    "bank",
    "money",
    "stone",
    "cloud",
    "music",
    "garden",
    "window",
    "letter",
    "forest",
    "engine",
    "silver",
    "harbor",
]
KINDS = ("stay", "stay", "leave", "edit", "explain", "atlas", "stay", "compare")


@dataclass
class Visit:
    kind: str
    index: int
    wait: float = 0.0  # seconds from the request to its script's end (the last one, for "edit")
    status: str = ""
    busy_seen: bool = False  # the queue message was shown
    full: int = 0  # times told the queue was full (then it retried after a few seconds)
    errors: list[str] = field(default_factory=list)


def text_of(i: int) -> str:
    """A 15-token-ish text of its own for visitor ``i``."""
    rng = random.Random(i)
    return f"visitor {i} writes about the " + " ".join(rng.choice(WORDS) for _ in range(9))


def _ws(url: str):
    from websockets.sync.client import connect
    from websockets.typing import Subprotocol

    return connect(
        url.replace("http://", "ws://") + "/_stcore/stream", subprotocols=[Subprotocol("streamlit")],
        open_timeout=30, max_size=2**28,
    )  # fmt: skip


def _rerun(ws, query: dict[str, str], page: str = "", widgets: Sequence[tuple[str, bool]] = ()) -> None:
    from streamlit.proto import BackMsg_pb2

    back = BackMsg_pb2.BackMsg()
    back.rerun_script.query_string = urllib.parse.urlencode(query)
    back.rerun_script.page_script_hash = ""
    back.rerun_script.page_name = page
    for wid, trigger in widgets:
        w = back.rerun_script.widget_states.widgets.add()
        w.id = wid
        w.trigger_value = trigger
    ws.send(back.SerializeToString())


def _until_finished(ws, deadline: float, visit: Visit, leave_after: float | None = None) -> dict:
    """Read ForwardMsgs until the script run finishes (or ``leave_after`` s pass: return early);
    returns {"status", "buttons": {label: id}}."""
    from streamlit.proto import ForwardMsg_pb2

    start = time.monotonic()
    buttons: dict[str, str] = {}
    while True:
        now = time.monotonic()
        if leave_after is not None and now - start > leave_after:
            return {"status": "left", "buttons": buttons}
        limit = min(deadline, start + leave_after if leave_after is not None else deadline) - now
        if limit <= 0:
            return {"status": "timeout", "buttons": buttons}
        try:
            raw = ws.recv(timeout=limit)
        except TimeoutError:
            continue
        msg = ForwardMsg_pb2.ForwardMsg()
        msg.ParseFromString(raw)
        kind = msg.WhichOneof("type")
        if kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
            el = msg.delta.new_element
            which = el.WhichOneof("type")
            if which == "alert" and "Busy:" in el.alert.body:
                visit.busy_seen = True
            elif which == "alert" and "queue is full" in el.alert.body:
                visit.full += 1
                buttons["__full__"] = "1"
            elif which == "alert" and el.alert.format == el.alert.ERROR:
                visit.errors.append(el.alert.body[:160])
            elif which == "exception":
                visit.errors.append(f"{el.exception.type}: {el.exception.message[:120]}")
            elif which == "button":
                buttons[el.button.label] = el.button.id
        elif kind == "script_finished":
            status = ForwardMsg_pb2.ForwardMsg.ScriptFinishedStatus.Name(msg.script_finished)
            if status != "FINISHED_EARLY_FOR_RERUN":
                return {"status": status, "buttons": buttons}


def _ask(ws, query: dict[str, str], page: str, v: Visit, deadline: float) -> dict:
    """One request; while the queue is full, press Retry after 2-5 s, like a visitor would."""
    while True:
        _rerun(ws, query, page=page)
        seen = _until_finished(ws, deadline, v)
        if "__full__" not in seen["buttons"] or time.monotonic() > deadline:
            return seen
        time.sleep(random.uniform(2, 5))


def visit(url: str, v: Visit, deadline: float, rng: random.Random) -> None:
    text = text_of(v.index)
    try:
        with _ws(url) as ws:
            t0 = time.monotonic()
            if v.kind == "leave":  # asks, then closes the tab while it waits
                _rerun(ws, {"text": text})
                v.status = _until_finished(ws, deadline, v, leave_after=rng.uniform(0.5, 3.0))["status"]
            elif v.kind == "edit":  # asks, edits the text while it waits, waits for the second
                _rerun(ws, {"text": text})
                _until_finished(ws, deadline, v, leave_after=rng.uniform(0.5, 2.0))
                t0 = time.monotonic()
                v.status = _ask(ws, {"text": text + " edited"}, "", v, deadline)["status"]
            elif v.kind == "explain":
                v.status = _ask(ws, {"text": text}, "Explain", v, deadline)["status"]
            elif v.kind == "patching":  # Explain's patching view: an estimate over the blocks
                query = {"text": text, "view": "patching", "corrupt": text_of(v.index + 1), "over": "blocks"}
                v.status = _ask(ws, {**query, "pest": "1"}, "Explain", v, deadline)["status"]
            elif v.kind == "compare":
                v.status = _ask(ws, {"text": text, "text2": text + " too"}, "Compare", v, deadline)["status"]
            elif v.kind == "atlas":  # opens the atlas on some texts and presses Run (or Resume)
                query = {"ntexts": str(6 + 6 * (v.index // len(KINDS)) % 24)}
                _rerun(ws, query, page="Head_atlas")
                seen = _until_finished(ws, deadline, v)
                run = next((i for label, i in seen["buttons"].items() if "atlas" in label), None)
                t0 = time.monotonic()
                if run is not None:
                    v.kind = "atlas run"
                    _rerun(ws, query, page="Head_atlas", widgets=[(run, True)])
                    seen = _until_finished(ws, deadline, v)
                v.status = seen["status"]
            else:
                v.status = _ask(ws, {"text": text}, "", v, deadline)["status"]
            v.wait = time.monotonic() - t0
    except Exception as err:  # noqa: BLE001 - reported per visitor
        v.status, v.errors = "client error", [*v.errors, repr(err)[:160]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fresh_atlas_cache(folder: Path) -> Path:
    """A cache folder that shares the converted models of the user's cache (symlinks) but has
    an empty atlas cache, so the atlas visitors compute (the user's atlas entries are untouched)."""
    real = Path(os.environ.get("ATTNVIZ_CACHE") or Path.home() / ".cache" / "attnviz").expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    for entry in real.iterdir() if real.is_dir() else ():
        link = folder / entry.name
        if entry.name != "atlas" and not link.exists():
            link.symlink_to(entry)
    return folder


@contextlib.contextmanager
def demo_server(log_path: Path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNVIZ_", "STREAMLIT_"))}
    env.update(ATTNVIZ_DEMO="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="attnviz-demo-load-") as tmp:
        env["ATTNVIZ_CACHE"] = str(fresh_atlas_cache(Path(tmp) / "cache"))
        with app_server(env, port, log_path) as (url, proc):
            yield url, proc.pid


@contextlib.contextmanager
def app_server(env: dict[str, str], port: int, log_path: Path):
    """``streamlit run app.py`` on loopback ``port`` with ``env``, its output in ``log_path``; yields
    (url, process) once healthy, and stops the whole process group after."""
    cmd = [
        sys.executable, "-m", "streamlit", "run", "app.py", "--server.address", "127.0.0.1",
        "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
        "--server.fileWatcherType", "none",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited: see {log_path}")
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/_stcore/health", timeout=2):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the server was not healthy after 120 s: see {log_path}")
            time.sleep(0.25)
        yield url, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def peak_rss(pid: int, stop: threading.Event, out: list[int]) -> None:
    import psutil

    proc = psutil.Process(pid)
    while not stop.is_set():
        with contextlib.suppress(psutil.Error):
            rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
            out[0] = max(out[0], rss)
        stop.wait(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--visitors", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=300, help="seconds for the whole load")
    ap.add_argument("--seed", type=int, default=34)
    ap.add_argument("--log", default=str(ROOT / "test-output" / "demo_load_server.log"))
    args = ap.parse_args()
    n = max(1, min(args.visitors, MAX_VISITORS))
    rng = random.Random(args.seed)
    log_path = Path(args.log)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with demo_server(log_path) as (url, pid):
        assert urllib.parse.urlparse(url).hostname in LOOPBACK
        warm = Visit("warm", -1)
        visit(url, warm, time.monotonic() + 120, rng)  # the model loads once, before the crowd
        print(f"warm-up run: {warm.wait:.1f} s ({warm.status})")
        stop, rss = threading.Event(), [0]
        threading.Thread(target=peak_rss, args=(pid, stop, rss), daemon=True).start()
        visits = [Visit(KINDS[i % len(KINDS)], i) for i in range(n)]
        deadline = time.monotonic() + args.timeout
        t0 = time.monotonic()
        threads = [
            threading.Thread(
                target=visit, args=(url, v, deadline, random.Random(args.seed + v.index)), daemon=True
            )
            for v in visits
        ]
        for t in threads:
            t.start()
            time.sleep(0.02)
        for t in threads:
            t.join(max(deadline - time.monotonic(), 0) + 5)
        load_seconds = time.monotonic() - t0
        after = Visit("after", 10_000)
        visit(url, after, time.monotonic() + 60, rng)  # the queue drained: a new visitor runs at once
        stop.set()
        log = log_path.read_text(errors="replace")
    stayed = [v for v in visits if v.kind != "leave"]
    print(f"{n} visitors in {load_seconds:.1f} s; load average {os.getloadavg()[0]:.2f} (1 min)")
    for kind in sorted({v.kind for v in visits}):
        of = [v for v in visits if v.kind == kind]
        statuses = sorted({v.status for v in of})
        print(
            f"  {kind:8s} {len(of):2d}: waits {min(v.wait for v in of):.1f}-{max(v.wait for v in of):.1f} s, "
            f"{statuses}, queue shown to {sum(v.busy_seen for v in of)}, "
            f"told 'full' {sum(v.full for v in of)} times"
        )
    errors = [(v.kind, v.index, e) for v in visits for e in v.errors]
    print(f"last visitor's wait: {max(v.wait for v in stayed):.1f} s")
    print(f"peak RSS of the server: {rss[0] / 2**30:.2f} GiB")
    print(f"a visitor after the load: {after.wait:.1f} s, {after.status}, queue shown: {after.busy_seen}")
    gate_lines = re.findall(r"gate: (?:running|idle).*", log)
    print(f"gate errors in the log: {len(re.findall(r'ERROR attnviz.server.gate', log))}")
    print(f"last gate line: {gate_lines[-1] if gate_lines else 'none'}")
    drained = after.status == "FINISHED_SUCCESSFULLY" and not after.busy_seen
    unfinished = [v for v in stayed if v.status != "FINISHED_SUCCESSFULLY"]
    print(f"queue drained: {drained}; visitors who stayed and did not finish: {len(unfinished)}")
    for kind, i, e in errors[:10]:
        print(f"  error ({kind} {i}): {e}")
    sys.exit(0 if drained and not unfinished else 1)


if __name__ == "__main__":
    main()
