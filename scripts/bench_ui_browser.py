"""The browser half of scripts/bench_ui.py: submit-to-first-view in Chromium against the real server.

Run through ``python scripts/bench_ui.py --browser``; see that file's docstring for what is timed.
The server and Chromium come from tests/server.py and tests/browser_page.py (the browser tests' helpers).
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import psutil  # noqa: E402
from bench_ui_common import forward_median, texts  # noqa: E402
from bench_ui_pages import run_pages  # noqa: E402
from browser_page import chromium, script_runs, wait_idle  # noqa: E402
from server import streamlit_server  # noqa: E402

import attnviz  # noqa: E402
from attnviz.bench.common import ids_of_length, replace_section  # noqa: E402

# Before the submit: remember every chart's current figure and its largest heatmap.
MARK_JS = """() => {
  for (const gd of document.querySelectorAll('.js-plotly-plot')) gd.__benchBefore = gd._fullData;
}"""

# The first heatmap of the new text is drawn: the summary line names the new token count, and a
# chart whose figure changed since the mark holds a heatmap of more than `rows` query rows whose
# image is in the SVG.
FIRST_VIEW_JS = """([n, rows]) => {
  const bad = document.querySelector('[data-testid="stException"], [data-testid="stAlertContentError"]');
  if (bad) return 'error: ' + bad.innerText;
  const caps = Array.from(document.querySelectorAll('[data-testid="stCaptionContainer"]'));
  if (!caps.some(c => c.innerText.includes(` ${n} tokens `))) return false;
  return Array.from(document.querySelectorAll('.js-plotly-plot')).some(gd => {
    const full = gd._fullData;
    if (!full || full === gd.__benchBefore) return false;
    const hm = full.find(t => t.type === 'heatmap' && t.z && t.z.length > rows);
    return !!hm && !!gd.querySelector('g.heatmaplayer image, g.hm image');
  });
}"""

HEADER = (
    "| N tokens | first view (submit → first heatmap drawn) | of which extraction (server log) | "
    "whole page drawn | one plain forward | first view / forward | whole page / forward | "
    "first view / forward in CPU time (server process / bench process) | "
    "load (1-min avg) before → after |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def extraction_seconds(log: str, n: int) -> float:
    """The server's own time for the last extraction of ``n`` tokens (attnviz.extract logs it;
    with the self-check, which runs up to 1,024 tokens, inside it)."""
    found = re.findall(rf"extract model=\S+ tokens={n} path=\S+ seconds=([0-9.]+)", log)
    return float(found[-1]) if found else float("nan")


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def one_run(page, text: str, n: int, server: psutil.Process) -> tuple[float, float, float]:
    """(first view, whole page, server CPU until the first view) seconds for one submit of
    ``text`` (``n`` tokens in the app)."""
    before = script_runs(page)
    page.evaluate(MARK_JS)
    box = page.locator('[data-testid="stSidebar"] textarea').first
    box.fill(text)  # a paste: one input event
    t0, c0 = time.perf_counter(), cpu_seconds(server)
    box.press("Control+Enter")
    done = page.wait_for_function(FIRST_VIEW_JS, arg=[n, 64], timeout=900_000, polling="raf")
    first, cpu = time.perf_counter() - t0, cpu_seconds(server) - c0
    if str(done.json_value()).startswith("error"):
        raise RuntimeError(f"the app showed an error: {done.json_value()}")
    wait_idle(page, 900_000, after=before)
    return first, time.perf_counter() - t0, cpu


def run_browser(
    lm: attnviz.LoadedModel, ns: list[int], repeats: int, out: Path, no_write: bool, pages: int = 0
) -> int:
    """The explorer's submit at each size in ``ns`` (table ui-browser), then, with ``pages``, the
    page costs at that many tokens (scripts/bench_ui_pages.py, table ui-pages)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still stops the server and Chromium
    forward_median(lm, lm.tokenizer.decode(ids_of_length(lm, 64)))  # the floor's own warm-up
    lines = []
    sys.stdout.write(HEADER + "\n")
    with streamlit_server(name="bench-ui", startup_timeout=300) as server, chromium() as browser:
        version = browser.version
        page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
        page.goto(server.url + "/?model=smollm2-135m")
        wait_idle(page, 600_000)  # the model is loaded and the default sentence drawn
        for n in ns:
            rows = []
            load0 = os.getloadavg()[0]
            # the first forward of a size pays one-off allocations in each process: warm both up
            warm, n_warm = texts(lm, n, 1, word="Warm")[0]
            forward_median(lm, warm, runs=1)
            one_run(page, warm, n_warm, psutil.Process(server.pid))
            for text, n_app in texts(lm, n, repeats):
                first, whole, cpu = one_run(page, text, n_app, psutil.Process(server.pid))
                extract = extraction_seconds(server.log(), n_app)
                floor, floor_cpu = forward_median(lm, text)
                rows.append((first, whole, floor, extract, cpu / floor_cpu))
                sys.stderr.write(f"  {n_app} tokens: first {first:.2f} s (extract {extract:.2f}), ")
                sys.stderr.write(f"page {whole:.2f} s, ")
                sys.stderr.write(f"forward {floor:.2f} s, CPU ratio {cpu / floor_cpu:.2f}\n")
            first, whole, floor, extract = (statistics.median(r[i] for r in rows) for i in range(4))
            ratio = statistics.median(r[0] / r[2] for r in rows)
            ratio_page = statistics.median(r[1] / r[2] for r in rows)
            ratio_cpu = statistics.median(r[4] for r in rows)
            line = (
                f"| {n_app} | {first:.2f} s | {extract:.2f} s | {whole:.2f} s | {floor:.2f} s | "
                f"{ratio:.2f}x | {ratio_page:.2f}x | {ratio_cpu:.2f}x | "
                f"{load0:.2f} → {os.getloadavg()[0]:.2f} |"
            )
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            lines.append(line)
        if pages:
            run_pages(page, lm, pages, repeats, out, no_write, version, server.log)
        page.context.close()
    if not no_write and lines:
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        replace_section(
            out,
            "ui-browser",
            f"Measured {stamp} with `python scripts/bench_ui.py --browser` (Chromium {version} "
            f"against `streamlit run app.py`, "
            f"CPU ({os.cpu_count()} cores, shared), smollm2-135m, medians of {repeats} submits per size, "
            f"each with its own forward).\n\n{HEADER}\n" + "\n".join(lines),
        )
    return 0
