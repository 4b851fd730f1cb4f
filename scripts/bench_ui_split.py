"""UI benchmark with the server and the browser apart (issue 31): on a shared 2-core box the
browser and the server take turns on the same cores, so a page's wall time says little about
either. This measures them one at a time.

    .venv/bin/python scripts/bench_ui_split.py [--n 1500] [--repeats 2] [--no-write] [--browser-only]

- **Server**: a websocket client (no browser; the protocol of tests/ws_client.py) opens the page
  with a fresh text of N tokens and times submit → the server's last message of that run
  (``script_finished``), with the server process's CPU seconds over the same window. One plain
  SDPA forward of the same text is measured in this process right after (median of three,
  `bench_ui_common.forward_median`); the ratio is server time / forward, in wall and in CPU time.
- **Browser**: Debian's Chromium (Playwright) opens the same link, its result now cached on the
  server; the CPU seconds of every Chromium process from navigation until the page is idle, less
  those of opening the same page with no text (the app's own load), are the browser's cost of
  drawing that view.

Pages: the Explorer, Model overview and Explain. Rows go to docs/benchmarks.md between the
ui-split markers, dated, with the 1-minute load average before and after (the box is shared).
``--browser-only``: one server run per page (to cache its result; its wall time is shown, no
forward is timed) and the browser's views: for long texts on a loaded box, where three server
runs and nine forwards of 8k tokens per page do not fit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import psutil  # noqa: E402
from bench_ui_common import forward_median, texts  # noqa: E402
from browser_cpu import chromium_cpu  # noqa: E402
from browser_page import chromium, wait_idle  # noqa: E402
from server import streamlit_server  # noqa: E402

import attnviz  # noqa: E402
from attnviz.bench.common import replace_section  # noqa: E402
from ui.link_text import pack_text  # noqa: E402

MODEL = "smollm2-135m"
PAGES = {"Explorer": "", "Model overview": "Model_overview", "Explain": "Explain"}
URL_TEXT_MAX = 30_000  # characters of a quoted text in a plain ``text=`` link
TARGET = {"Explorer": 1.05, "Model overview": 1.5, "Explain": 1.5}  # issues 31, 40: server / forward


def link_query(text: str) -> str:
    """The query of a link to ``text`` on smollm2: the text readable, or compressed (``tz``, as the
    app's own links) past `URL_TEXT_MAX` characters: an 8k-token text in plain ``text=`` made a
    request line the server refused (the browser never got the page)."""
    quoted = urllib.parse.quote(text)
    if len(quoted) <= URL_TEXT_MAX:
        return urllib.parse.urlencode({"model": MODEL, "text": text}, quote_via=urllib.parse.quote)
    return urllib.parse.urlencode({"model": MODEL, "tz": pack_text(text)})


def server_run(
    url: str, query: str, page: str, proc: psutil.Process, timeout: float = 900
) -> tuple[float, float]:
    """(wall, server CPU) seconds from sending the run to the server's last message of it."""
    from streamlit.proto import BackMsg_pb2, ForwardMsg_pb2
    from websockets.sync.client import connect
    from websockets.typing import Subprotocol

    ws_url = url.replace("http://", "ws://") + "/_stcore/stream"
    with connect(ws_url, subprotocols=[Subprotocol("streamlit")], open_timeout=30, max_size=2**28) as ws:
        back = BackMsg_pb2.BackMsg()
        back.rerun_script.query_string = query
        back.rerun_script.page_name = page
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        ws.send(back.SerializeToString())
        while True:
            msg = ForwardMsg_pb2.ForwardMsg()
            msg.ParseFromString(ws.recv(timeout=timeout))
            if msg.WhichOneof("type") == "script_finished":
                status = ForwardMsg_pb2.ForwardMsg.ScriptFinishedStatus.Name(msg.script_finished)
                if status != "FINISHED_EARLY_FOR_RERUN":
                    return time.monotonic() - t0, sum(proc.cpu_times()[:2]) - cpu0


def open_link(pg, url: str, path: str, query: str) -> float:
    """Chromium's CPU seconds to open ``url/path?query`` until the page is idle and drawn."""
    c0 = chromium_cpu()
    pg.goto(f"{url}/{path}?{query}")
    wait_idle(pg, timeout_ms=600_000)
    pg.wait_for_timeout(1000)  # the last charts' drawing after the run ends
    return chromium_cpu() - c0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[1500], help="one or more text lengths")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--browser-only", action="store_true", help="one server run, no forward timed")
    args = ap.parse_args()
    lm = attnviz.load_model(MODEL, device="cpu")
    load0 = os.getloadavg()[0]
    rows = []
    with streamlit_server(name="bench_split") as s:
        proc = psutil.Process(s.pid)
        server_run(s.url, urllib.parse.urlencode({"model": MODEL}), "", proc)  # load the model
        for n, (page, path) in ((n, pp) for n in args.n for pp in PAGES.items()):
            walls, cpus, used = [], [], []
            for text, count in texts(lm, n, 1 if args.browser_only else args.repeats, word=f"Split {page}"):
                wall, cpu = server_run(s.url, link_query(text), path, proc)
                if args.browser_only:  # the result is cached: no forward to compare with
                    used.append((text, count, wall, float("nan")))
                    print(f"{page} {count} tokens: server {wall:.2f} s (no forward timed)", flush=True)
                    continue
                fwd, fwd_cpu = forward_median(lm, text)
                walls.append(wall / fwd)
                cpus.append(cpu / fwd_cpu)
                used.append((text, count, wall, fwd))
                print(f"{page} {count} tokens: server {wall:.2f} s, forward {fwd:.2f} s", flush=True)
            text, count, _, _ = used[-1]
            with chromium() as b:
                ctx = b.new_context(viewport={"width": 1440, "height": 1000})
                pg = ctx.new_page()
                empty = urllib.parse.urlencode({"model": MODEL, "text": ""})
                full = link_query(text)
                open_link(pg, s.url, path, empty)  # the browser's first load of the app (cache warm)
                views = []
                for _ in range(args.repeats):  # each view less the app's own load (no text, no figure)
                    shell = open_link(pg, s.url, path, empty)
                    views.append(open_link(pg, s.url, path, full) - shell)
                browser = statistics.median(views)
                ctx.close()
            server = f"{statistics.median(u[2] for u in used):.2f} s"
            if args.browser_only:
                rows.append(f"| {page} | {count} | {server} | not timed | – | – | ≤ {TARGET[page]}x | "
                            f"{browser:.2f} s (≤ 0.5 s) |")  # fmt: skip
            else:
                ratio, ratio_cpu = statistics.median(walls), statistics.median(cpus)
                rows.append(
                    f"| {page} | {count} | {server} | {statistics.median(u[3] for u in used):.2f} s | "
                    f"{ratio:.2f}x | {ratio_cpu:.2f}x | ≤ {TARGET[page]}x | {browser:.2f} s (≤ 0.5 s) |"
                )
            print(rows[-1], flush=True)
    load1 = os.getloadavg()[0]
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    body = (
        f"Measured {stamp} with `python scripts/bench_ui_split.py --n {' '.join(map(str, args.n))} "
        f"--repeats {args.repeats}{' --browser-only' if args.browser_only else ''}` "
        f"(medians of {args.repeats}) "
        f"(CPU, {MODEL}, {os.cpu_count()} cores shared with other work: 1-min load {load0:.1f} before, "
        f"{load1:.1f} after; the machine was loaded by other engineers' tests, so the times are "
        "upper bounds). Server: submit → the server's last message of the run (websocket client, "
        "no browser) over one plain forward of the same text (median of 3) measured right after; "
        "in CPU time: the server process's CPU over this process's; server and forward run on 1 "
        "thread (OMP_NUM_THREADS=1). Browser: Chromium's CPU seconds to open the same link (its "
        "result cached on the server) less those to open the page with no text (the app's own "
        "load), the browser's cache warm; the median of that difference over the views.\n\n"
        "| page | N tokens | server (submit → last message) | one plain forward | server / forward | "
        "same in CPU time | target | Chromium CPU for the view |\n|---|---|---|---|---|---|---|---|\n"
        + "\n".join(rows)
    )
    print(body)
    if not args.no_write:
        replace_section(args.out, "ui-split", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
