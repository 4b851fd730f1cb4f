"""What drawing the Explorer's cells costs Chromium in Plotly, by form (issue 40, item 2).

    .venv/bin/python scripts/bench_plotly_forms.py [--repeats 3]

Static pages, no Streamlit: plotly.js (the one the installed plotly package ships) draws the
Explorer's cell counts at 1.5k tokens (a 3x3 grid of 108x108 tiles, 104,976 cells, and one
500x500 head, 250,000 cells; random rows that sum to 1) in three forms, each chart plotted once:

- ``heatmap``: ``go.Heatmap`` traces (what the app draws now);
- ``image``: ``go.Image(source=<PNG data URI>)``, one pixel per cell coloured on the server, with
  the exact value in the hover from ``customdata`` (``%{customdata:.4f}``);
- ``image_nohover``: the same images without hover data (the floor of the image form).

Each is Chromium's CPU seconds (every process) to open the page until both charts are drawn,
less a page with plotly.js and no chart; medians over ``--repeats`` after one warm-up.
"""

from __future__ import annotations

import argparse
import base64
import io
import logging
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests")]

import numpy as np  # noqa: E402
import plotly  # noqa: E402
import plotly.graph_objects as go  # noqa: E402
from browser_cpu import chromium_cpu  # noqa: E402
from browser_page import chromium  # noqa: E402
from PIL import Image  # noqa: E402
from plotly.colors import sample_colorscale  # noqa: E402
from plotly.subplots import make_subplots  # noqa: E402

log = logging.getLogger("bench_plotly_forms")
FORMS = ("blank", "heatmap", "image", "image_nohover")
HOVER = "query %{y}<br>key %{x}<br>%{VALUE:.4f}<extra></extra>"


def viridis_lut() -> np.ndarray:
    colours = sample_colorscale("Viridis", list(np.linspace(0, 1, 256)))
    return np.array([[int(float(c)) for c in s[4:-1].split(",")] for s in colours], dtype=np.uint8)


def png_uri(z: np.ndarray, zmax: float, lut: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(lut[np.clip(z / zmax * 255, 0, 255).astype(np.uint8)]).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def cells(form: str, z: np.ndarray, zmax: float, lut: np.ndarray) -> go.BaseTraceType:
    if form == "heatmap":
        return go.Heatmap(z=z, coloraxis="coloraxis", hovertemplate=HOVER.replace("VALUE", "z"))
    if form == "image_nohover":
        return go.Image(source=png_uri(z, zmax, lut), hoverinfo="skip")
    return go.Image(
        source=png_uri(z, zmax, lut),
        customdata=np.round(z, 6),
        hovertemplate=HOVER.replace("VALUE", "customdata"),
    )


def page(form: str, folder: Path) -> Path:
    body = ""
    if form != "blank":
        rng, lut = np.random.default_rng(0), viridis_lut()
        grid = rng.dirichlet(np.ones(108), size=(9, 108)).astype(np.float32)
        big = rng.dirichlet(np.ones(500), size=500).astype(np.float32)
        g = make_subplots(rows=3, cols=3, horizontal_spacing=0.02, vertical_spacing=0.05)
        for i in range(9):
            g.add_trace(cells(form, grid[i], float(grid.max()), lut), row=i // 3 + 1, col=i % 3 + 1)
        b = go.Figure(cells(form, big, float(big.max()), lut))
        for fig in (g, b):
            fig.update_layout(width=474, height=400, coloraxis=dict(colorscale="Viridis"))
        body = "".join(f.to_html(full_html=False, include_plotlyjs=False) for f in (g, b))
    path = folder / f"{form}.html"
    path.write_text(f'<html><head><script src="plotly.min.js"></script></head><body>{body}</body></html>')
    return path


DRAWN_JS = """n => { const g = document.querySelectorAll('.js-plotly-plot');
  return g.length === n && Array.from(g).every(d => d._fullLayout); }"""


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="plotly-forms-"))
    shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", folder / "plotly.min.js")
    pages = {form: page(form, folder) for form in FORMS}
    log.info("page sizes: %s; load %s", {f: p.stat().st_size for f, p in pages.items()}, os.getloadavg())
    cpu: dict[str, list[float]] = {form: [] for form in FORMS}
    with chromium() as browser:
        pg = browser.new_page(viewport={"width": 1440, "height": 1000})
        for rep in range(args.repeats + 1):
            for form, path in pages.items():
                c0 = chromium_cpu()
                pg.goto(path.as_uri())
                pg.wait_for_function(DRAWN_JS, arg=0 if form == "blank" else 2)
                pg.wait_for_timeout(1000)
                if rep:
                    cpu[form].append(chromium_cpu() - c0)
    blank = statistics.median(cpu["blank"])
    for form in FORMS[1:]:
        log.info("%s: %.2f s of Chromium CPU over the blank page (%s)", form,
                 statistics.median(cpu[form]) - blank, [round(c, 2) for c in cpu[form]])  # fmt: skip
    log.info("blank page %.2f s; load after %s", blank, os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
