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
span.tok { padding: 2px 1px; border-radius: 3px; cursor: default; white-space: pre; }
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
    spans = "".join(
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
