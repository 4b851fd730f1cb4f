"""Views whose hover is computed in the browser: every number they show is in the page, so a
hover answers at once, with no round trip to the server (BertViz / CircuitsVis style)."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence

import numpy as np

HOVER_MAX_TOKENS = 512  # N x N float32 in the page: 1 MiB at 512 tokens
_VIRIDIS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"]  # the heatmaps' default map

_SCRIPT = """
<script>
(() => {
  const N = %(n)d, stops = %(stops)s;
  const raw = atob("%(data)s"), bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  const w = new Float32Array(bytes.buffer);
  const spans = document.querySelectorAll("span.tok"), info = document.getElementById("info");
  const mix = (a, b, t) => Math.round(a + (b - a) * t);
  const hex = s => [1, 3, 5].map(k => parseInt(s.slice(k, k + 2), 16));
  const rgb = stops.map(hex);
  function colour(v) {
    const x = Math.min(Math.max(v, 0), 1) * (rgb.length - 1), i = Math.min(Math.floor(x), rgb.length - 2);
    const a = rgb[i], b = rgb[i + 1], t = x - i;
    return `rgb(${mix(a[0], b[0], t)},${mix(a[1], b[1], t)},${mix(a[2], b[2], t)})`;
  }
  function paint(i) {
    let m = 0;
    for (let j = 0; j < N; j++) m = Math.max(m, w[i * N + j]);
    for (let j = 0; j < N; j++) {
      const v = m > 0 ? w[i * N + j] / m : 0, s = spans[j];
      s.style.background = colour(v);
      s.style.color = v > 0.55 ? "#111" : "#fff";
      s.title = `weight ${w[i * N + j].toFixed(4)}`;
      s.classList.toggle("on", j === i);
    }
    const what = document.body.dataset.what;
    info.textContent = `${spans[i].dataset.label} ${what} (colour: weight / its largest, ${m.toFixed(4)})`;
  }
  spans.forEach((s, i) => s.addEventListener("mouseenter", () => paint(i)));
  paint(%(start)d);
})();
</script>
"""

_STYLE = """
<style>
body { font-family: "Source Sans Pro", sans-serif; font-size: 15px; margin: 4px; line-height: 1.9; }
span.tok { padding: 2px 1px; border-radius: 3px; cursor: default; white-space: pre-wrap; }
span.tok.on { outline: 2px solid #e4002b; }
#info { font-size: 13px; color: #555; margin-bottom: 6px; min-height: 1.2em; }
</style>
"""


def hover_text_html(
    weights: np.ndarray, tokens: Sequence[str], *, start: int = 0, what: str = "attends to"
) -> str:
    """A standalone HTML view of a text: hovering a token colours every token by that token's
    row of ``weights`` (N, N): rows are the hovered token (query), columns the coloured ones;
    pass the transpose for "is attended by". The whole matrix is in the page as float32, so
    a hover needs no server; ``start`` is painted first. ``tokens`` are plain text (escaped)."""
    w = np.ascontiguousarray(np.asarray(weights, dtype="<f4"))
    n = len(tokens)
    if w.shape != (n, n):
        raise ValueError(f"weights {w.shape} do not match {n} tokens")
    # <wbr> between tokens: a line may break there (adjacent spans alone give the browser no place
    # to break, and a long text ran off the frame on one line)
    spans = "<wbr>".join(
        f'<span class="tok" data-label="{html.escape(f"({i}) {t}")}">{html.escape(t)}</span>'
        for i, t in enumerate(tokens)
    )
    script = _SCRIPT % {
        "n": n,
        "stops": json.dumps(_VIRIDIS),
        "data": base64.b64encode(w.tobytes()).decode(),
        "start": int(min(max(start, 0), n - 1)),
    }
    body = f'<body data-what="{html.escape(what)}"><div id="info"></div><div id="text">{spans}</div>'
    return f"<!doctype html><html><head><meta charset='utf-8'>{_STYLE}</head>{body}{script}</body></html>"


_LINES_SCRIPT = """
<script>
(() => {
  const D = %(data)s;
  const left = document.querySelectorAll("#left div"), right = document.querySelectorAll("#right div");
  const svg = document.getElementById("svg"), info = document.getElementById("info");
  const y = el => el.offsetTop + el.offsetHeight / 2;  // #wrap is the offset parent of both
  svg.setAttribute("height", document.getElementById("left").offsetHeight);
  function draw(i) {
    let out = "";
    D.idx.forEach((heads, h) => heads[i].forEach((j, r) => {
      const w = D.w[h][i][r];
      if (w < D.min) return;
      out += `<line x1="0" y1="${y(left[i])}" x2="90" y2="${y(right[j])}" stroke="${D.colours[h]}" ` +
             `stroke-width="${1 + 4 * w}" stroke-opacity="${0.25 + 0.75 * w}"><title>${D.heads[h]}: ` +
             `${w.toFixed(4)}</title></line>`;
    }));
    svg.innerHTML = out;
    left.forEach((el, k) => el.classList.toggle("on", k === i));
    info.textContent = `${left[i].dataset.label}: each head's top ${D.k} (hover another token)`;
  }
  left.forEach((el, i) => el.addEventListener("mouseenter", () => draw(i)));
  draw(%(start)d);
})();
</script>
"""

_LINES_STYLE = """
<style>
body { font-family: "Source Sans Pro", sans-serif; font-size: 13px; margin: 4px; }
#wrap { display: grid; grid-template-columns: 1fr 90px 1fr; position: relative; }
#left div { text-align: right; padding-right: 4px; height: 18px; white-space: pre; cursor: default; }
#right div { text-align: left; padding-left: 4px; height: 18px; white-space: pre; }
#left div.on { background: #ffe3e8; outline: 1px solid #e4002b; }
svg { overflow: visible; }
#info { color: #555; margin-bottom: 6px; }
#legend span { margin-right: 10px; }
</style>
"""


def hover_lines_html(
    top_idx: np.ndarray,
    top_w: np.ndarray,
    tokens: Sequence[str],
    head_names: Sequence[str],
    colours: Sequence[str],
    *,
    start: int = 0,
    min_weight: float = 0.02,
) -> str:
    """BertViz's view: tokens on the left and on the right, and for the token under the pointer
    (left) a line to each head's top-k partners (right), width and opacity by weight. Only the
    top k of every (head, token) are in the page (``top_idx`` / ``top_w``: (heads, N, k)), so a
    hover draws at once with no server."""
    n = len(tokens)
    if top_idx.shape != top_w.shape or top_idx.shape[:2] != (len(head_names), n):
        raise ValueError(f"top-k arrays {top_idx.shape} do not match {len(head_names)} heads x {n} tokens")
    data = {
        "idx": np.asarray(top_idx, dtype=int).tolist(),
        "w": np.round(np.asarray(top_w, dtype=float), 5).tolist(),
        "heads": [html.escape(h) for h in head_names],
        "colours": list(colours),
        "k": int(top_idx.shape[2]),
        "min": float(min_weight),
    }
    rows = "".join(
        f'<div data-label="{html.escape(f"({i}) {t}")}">{html.escape(t)}</div>' for i, t in enumerate(tokens)
    )
    legend = "".join(
        f'<span style="color:{c}">━ {html.escape(h)}</span>' for h, c in zip(head_names, colours, strict=True)
    )
    body = (
        f'<div id="info"></div><div id="legend">{legend}</div><div id="wrap"><div id="left">{rows}</div>'
        f'<svg id="svg" width="90"></svg><div id="right">{rows}</div></div>'
    )
    script = _LINES_SCRIPT % {"data": json.dumps(data), "start": int(min(max(start, 0), n - 1))}
    head = f"<head><meta charset='utf-8'>{_LINES_STYLE}</head>"
    return f"<!doctype html><html>{head}<body>{body}{script}</body></html>"
