"""Where Chromium's CPU goes when it draws one cached view (issue 40, item 2).

    .venv/bin/python scripts/trace_ui_browser.py [--n 1500] [--pages Explorer "Model overview" Explain]

For each page: the server computes the view once (a warm-up navigation), then Debian's Chromium
opens the page with no text, and the same link with the text under a Chromium trace
(``devtools.timeline`` + the V8 sampling profiler). It prints, for the view:

- every Chromium process's CPU seconds (psutil, by process type: renderer, gpu, browser);
- the renderer main thread's time by kind (script, style, layout, paint, GC, other), from the
  trace's events, self time only;
- the script time by the file it ran in (Plotly's chunk, Streamlit's own bundle, ...), from the
  profiler's samples, the leaf-most frame with a URL;
- each Plotly chart's traces (by type), heatmap cells, and how many times it was plotted
  (``plotly_afterplot`` events counted by a hook installed before the page's scripts run).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import sys
import tempfile
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import psutil  # noqa: E402
from bench_ui_common import texts  # noqa: E402
from browser_page import chromium, wait_idle  # noqa: E402
from server import streamlit_server  # noqa: E402

import attnviz  # noqa: E402

log = logging.getLogger("trace_ui_browser")
MODEL = "smollm2-135m"
PAGES = {"Explorer": "", "Model overview": "Model_overview", "Explain": "Explain"}
CATEGORIES = (
    "devtools.timeline,disabled-by-default-devtools.timeline,v8,v8.execute,"
    "disabled-by-default-v8.cpu_profiler,blink,blink.user_timing"
)

# Counts plotly_afterplot per chart div: Plotly assigns ``gd.emit = ...`` once per div (Events.init).
PLOT_COUNTER_JS = """
window.__plots = [];
Object.defineProperty(HTMLElement.prototype, 'emit', {
  configurable: true,
  set(fn) {
    const rec = {plots: 0};
    window.__plots.push(rec);
    const gd = this;
    gd.__plotRec = rec;
    Object.defineProperty(gd, 'emit', {configurable: true, writable: true, value: function (ev, data) {
      if (ev === 'plotly_afterplot') rec.plots += 1;
      return fn.apply(this, arguments);
    }});
  },
  get() { return undefined; },
});
"""

CHART_STATS_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => {
  const types = {};
  let cells = 0;
  for (const t of gd._fullData || []) {
    types[t.type] = (types[t.type] || 0) + 1;
    if (t.type === 'heatmap' && t.z) cells += t.z.reduce((a, row) => a + (row.length || 0), 0);
  }
  return {title: (gd._fullLayout && gd._fullLayout.title && gd._fullLayout.title.text) || '',
          types, cells, plots: gd.__plotRec ? gd.__plotRec.plots : null,
          w: gd._fullLayout ? gd._fullLayout.width : 0, h: gd._fullLayout ? gd._fullLayout.height : 0};
})"""

SCRIPT = {"FunctionCall", "EvaluateScript", "v8.compile", "v8.compileModule", "TimerFire",
          "EventDispatch", "RunMicrotasks", "FireAnimationFrame", "v8.run", "V8.Execute",
          "v8.callFunction", "V8.ScriptCompiler", "ParseHTML", "XHRReadyStateChange"}  # fmt: skip
STYLE = {"UpdateLayoutTree", "RecalcStyles", "ScheduleStyleRecalculation", "ParseAuthorStyleSheet"}
LAYOUT = {"Layout", "UpdateLayerTree", "PrePaint", "IntersectionObserverController::computeIntersections"}
PAINT = {"Paint", "PaintImage", "Decode Image", "CompositeLayers", "Layerize", "Commit", "RasterTask"}
GC = {
    "MinorGC",
    "MajorGC",
    "V8.GCScavenger",
    "V8.GCFinalizeMC",
    "BlinkGC.AtomicPhase",
    "V8.GC_MC_BACKGROUND_MARKING",
}


def kind_of(name: str) -> str:
    for label, names in (
        ("script", SCRIPT),
        ("style", STYLE),
        ("layout", LAYOUT),
        ("paint", PAINT),
        ("gc", GC),
    ):
        if name in names:
            return label
    if "GC" in name:
        return "gc"
    return "other"


def chromium_cpu_by_type() -> dict[str, float]:
    out: dict[str, float] = collections.Counter()
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if "chrom" not in p.name().lower():
                continue
            kind = next((a.split("=", 1)[1] for a in p.cmdline() if a.startswith("--type=")), "browser")
            out[kind] += sum(p.cpu_times()[:2])
        except psutil.NoSuchProcess:
            continue
    return out


def main_thread_self_times(events: list[dict], names: collections.Counter) -> dict[str, float]:
    """Self thread-time (s) by kind on each renderer main thread (CrRendererMain), X events only
    (the event's thread time: the box is shared, wall durations include waiting for a core).
    ``names`` gets the self time by event name."""
    main = {(e["pid"], e["tid"]) for e in events if e.get("name") == "thread_name"
            and e.get("args", {}).get("name") == "CrRendererMain"}  # fmt: skip
    spans = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and (e["pid"], e["tid"]) in main and "dur" in e:
            spans[(e["pid"], e["tid"])].append(
                (e["ts"], e["ts"] + e["dur"], e["name"], e.get("tdur", e["dur"]))
            )
    totals: dict[str, float] = collections.Counter()
    for thread in spans.values():
        thread.sort(key=lambda s: (s[0], -s[1]))
        stack: list[list] = []  # [start, end, name, thread_time, children's thread time]

        def close(item: list, stack: list[list] = stack) -> None:
            if stack:
                stack[-1][4] += item[3]
            totals[kind_of(item[2])] += max(item[3] - item[4], 0) / 1e6
            names[item[2]] += max(item[3] - item[4], 0) / 1e6

        for start, end, name, tdur in thread:
            while stack and stack[-1][1] <= start:
                close(stack.pop())
            stack.append([start, min(end, stack[-1][1]) if stack else end, name, tdur, 0.0])
        while stack:
            close(stack.pop())
    return totals


def profile_by_url(events: list[dict]) -> dict[str, float]:
    """Sampled time (s) by the leaf-most frame's script URL, from the trace's ProfileChunk events."""
    nodes: dict[tuple, dict] = {}
    parents: dict[tuple, int] = {}
    totals: dict[str, float] = collections.Counter()
    for e in events:
        if e.get("name") != "ProfileChunk":
            continue
        data = e["args"]["data"]
        key = (e["pid"], e.get("id"))
        prof = data.get("cpuProfile", {})
        for n in prof.get("nodes", []):
            nodes[(*key, n["id"])] = n["callFrame"]
            if "parent" in n:
                parents[(*key, n["id"])] = n["parent"]
        for sample, delta in zip(prof.get("samples", []), data.get("timeDeltas", []), strict=False):
            node = (*key, sample)
            label = None
            while node in nodes:
                frame = nodes[node]
                if frame.get("url"):
                    label = frame["url"].rsplit("/", 1)[-1].split("?")[0]
                    break
                if label is None and frame.get("functionName", "").startswith("("):
                    label = frame["functionName"]
                    break
                if node not in parents:
                    break
                node = (*key, parents[node])
            totals[label or "(native)"] += max(delta, 0) / 1e6
    return totals


def profile_inclusive(events: list[dict], url_part: str) -> dict[str, float]:
    """Sampled time (s) with a frame from a script whose URL contains ``url_part`` anywhere on the
    stack, by the leaf frame's function (native work Plotly starts counts here: its canvas, PNG
    encoding, the SVG's layout), and the total under "(all)"."""
    nodes: dict[tuple, dict] = {}
    parents: dict[tuple, tuple] = {}
    totals: collections.Counter = collections.Counter()
    for e in events:
        if e.get("name") != "ProfileChunk":
            continue
        data, key = e["args"]["data"], (e["pid"], e.get("id"))
        prof = data.get("cpuProfile", {})
        for n in prof.get("nodes", []):
            nodes[(*key, n["id"])] = n["callFrame"]
            if "parent" in n:
                parents[(*key, n["id"])] = (*key, n["parent"])
        for sample, delta in zip(prof.get("samples", []), data.get("timeDeltas", []), strict=False):
            leaf = node = (*key, sample)
            while node in nodes and url_part not in nodes[node].get("url", ""):
                node = parents.get(node, ())
            if node in nodes:
                frame = nodes[leaf]
                totals[
                    f"{frame.get('functionName') or '(anonymous)'} {frame.get('url', '').rsplit('/', 1)[-1]}"
                ] += max(delta, 0) / 1e6
                totals["(all)"] += max(delta, 0) / 1e6
    return totals


def trace_view(browser, url: str, path: str, full: str, empty: str, out_dir: Path, page_name: str) -> dict:
    ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
    ctx.add_init_script(PLOT_COUNTER_JS)
    pg = ctx.new_page()
    for query in (full, empty):  # warm: the server's result cache and the browser's cache
        pg.goto(f"{url}/{path}?{query}")
        wait_idle(pg, timeout_ms=900_000)
        pg.wait_for_timeout(1000)
    trace_path = out_dir / f"trace-{page_name.replace(' ', '_')}.json"
    cpu0 = chromium_cpu_by_type()
    browser.start_tracing(page=pg, path=str(trace_path), categories=CATEGORIES.split(","))
    pg.goto(f"{url}/{path}?{full}")
    wait_idle(pg, timeout_ms=900_000)
    pg.wait_for_timeout(1000)
    browser.stop_tracing()
    cpu1 = chromium_cpu_by_type()
    stats = pg.evaluate(CHART_STATS_JS)
    ctx.close()
    raw = json.loads(trace_path.read_text())
    events = raw["traceEvents"] if isinstance(raw, dict) else raw
    names: collections.Counter = collections.Counter()
    return {
        "cpu": {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1},
        "main": main_thread_self_times(events, names),
        "names": names,
        "plotly_inclusive": profile_inclusive(events, "PlotlyChart"),
        "urls": profile_by_url(events),
        "charts": stats,
    }


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1500)
    ap.add_argument("--pages", nargs="+", default=list(PAGES))
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "attnviz-trace")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    lm = attnviz.load_model(MODEL, device="cpu")
    log.info("load before: %s", os.getloadavg())
    with streamlit_server(name="trace_ui") as s, chromium() as b:
        for page in args.pages:
            text, count = texts(lm, args.n, 1, word=f"Trace {page}")[0]
            full = urllib.parse.urlencode({"model": MODEL, "text": text}, quote_via=urllib.parse.quote)
            empty = urllib.parse.urlencode({"model": MODEL, "text": ""})
            r = trace_view(b, s.url, PAGES[page], full, empty, args.out, page)
            log.info("== %s, %d tokens (load %s)", page, count, os.getloadavg())
            log.info(
                "chromium CPU by process: %s", {k: round(v, 2) for k, v in r["cpu"].items() if v > 0.005}
            )
            log.info(
                "renderer main thread self time: %s", {k: round(v, 2) for k, v in sorted(r["main"].items())}
            )
            top = sorted(r["urls"].items(), key=lambda kv: -kv[1])[:8]
            log.info("sampled time by script: %s", [(k, round(v, 2)) for k, v in top])
            log.info(
                "main thread top events (self): %s", [(k, round(v, 2)) for k, v in r["names"].most_common(10)]
            )
            log.info("under Plotly's chunk (inclusive, sampled): %s",
                     [(k, round(v, 2)) for k, v in r["plotly_inclusive"].most_common(12)])  # fmt: skip
            for c in r["charts"]:
                log.info("chart %r: %s, %d heatmap cells, plotted %s times, %dx%d px",
                         c["title"][:40], c["types"], c["cells"], c["plots"], c["w"], c["h"])  # fmt: skip
    log.info("load after: %s", os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
