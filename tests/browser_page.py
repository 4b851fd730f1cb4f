"""Test helpers: Debian's Chromium via Playwright, and what a page shows (charts, alerts, reruns)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
WIDTH = 1440  # the page width of every browser test (and its screenshots)
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
    """Every axis tick label text on the page: a Plotly chart's (SVG <text> nodes) and a heatmaps
    element's token labels (ui/heatmaps.js: `.avh-xlabels` / `.avh-ylabels`)."""
    return page.eval_on_selector_all(
        ".js-plotly-plot g.xtick text, .js-plotly-plot g.ytick text, .avh-xlabels div, .avh-ylabels div",
        "els => els.map(e => e.textContent)",
    )


CHARTS_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot, [data-testid=attnvizHeatmaps]'))
 .map(gd => {
  if (gd.__avhData) {  // a heatmaps element (ui/heatmaps.py): its panels, values as drawn
    const d = gd.__avhData, one = d.panels.length === 1 ? d.panels[0] : null;
    const floats = b64 => { const s = atob(b64), b = new Uint8Array(s.length);
      for (let i = 0; i < s.length; i++) b[i] = s.charCodeAt(i); return new Float32Array(b.buffer); };
    const z = one && (() => { const v = floats(one.values), rows = [];
      for (let r = 0; r < one.rows; r++) rows.push(Array.from(v.subarray(r * one.cols, (r + 1) * one.cols)));
      return rows; })();
    return {title: gd.querySelector('.avh-title').textContent, traces: d.panels.length, element: d.id,
            labels: !!d.labels,
            x: one ? (one.k || d.k) : null, y: one ? (one.q || d.q) : null, z: z};
  }
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
TITLES_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot, [data-testid=attnvizHeatmaps]'))
  .map(g => g.__avhData ? g.querySelector('.avh-title').textContent
                        : ((g._fullLayout && g._fullLayout.title && g._fullLayout.title.text) || ''))"""


def charts(page) -> list[dict]:
    """Each chart on the page (Plotly charts and heatmaps elements, `ui.heatmaps`): title, trace
    (panel) count and, for single-trace charts, x/y/z (an element's labels are plain text)."""
    return page.evaluate(CHARTS_JS)


def titles(page) -> list[str]:
    """Every chart's title (Plotly charts and heatmaps elements)."""
    return page.evaluate(TITLES_JS)


def alerts(page) -> list[str]:
    """Texts of st.error / st.warning / st.exception boxes on the page."""
    return page.eval_on_selector_all(
        '[data-testid="stAlert"], [data-testid="stException"]', "els => els.map(e => e.innerText)"
    )
