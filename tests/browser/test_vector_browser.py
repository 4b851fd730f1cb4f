"""The SVG export rendered by Chromium against the PNG export (Plotly's own image of the same
figure, what the chart's camera button saves): every cell the same colour within 2/255."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from attnviz import figures as F
from attnviz.figures import vector as V

pytestmark = [pytest.mark.browser, pytest.mark.slow]

N, WIDTH, HEIGHT = 12, 800, 520
TOLERANCE = 2  # per channel, of 255: the two colour interpolations round differently

PLOTLY_PNG_JS = """async (n) => {
  const gd = document.querySelector('.js-plotly-plot');
  while (!gd._fullLayout) await new Promise(r => setTimeout(r, 50));
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, centres = [];
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++)
    centres.push([xa._offset + xa.l2p(j), ya._offset + ya.l2p(i)]);
  const size = {width: gd._fullLayout.width, height: gd._fullLayout.height};
  const png = await Plotly.toImage(gd, {format: 'png', ...size});
  return [png, centres];
}"""


def decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)


def test_the_svg_in_chromium_matches_the_png_export_cell_by_cell(browser):
    z = np.tril(np.random.default_rng(7).random((N, N))).astype(np.float32)
    z /= z.sum(-1, keepdims=True)
    fig = F.head_heatmap(z, F.token_labels([f"tok{i}" for i in range(N)]), title="head", height=HEIGHT)
    fig.update_layout(width=WIDTH)
    page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    page.set_content(fig.to_html(include_plotlyjs=True, full_html=True, config={"responsive": False}))
    png_url, centres = page.evaluate(PLOTLY_PNG_JS, N)
    plotly_png = decode(base64.b64decode(png_url.split(",", 1)[1]))
    page.set_content(f"<html><body style='margin:0'>{V.to_svg(fig, WIDTH).decode()}</body></html>")
    svg_png = decode(page.screenshot(clip=dict(x=0, y=0, width=WIDTH, height=HEIGHT)))
    x, y, w, h, _ = V.scene_of(fig, WIDTH).images[0]
    worst = 0
    for k, (px, py) in enumerate(centres):
        i, j = divmod(k, N)
        ours = svg_png[int(y + (i + 0.5) * h / N), int(x + (j + 0.5) * w / N)]
        theirs = plotly_png[round(py), round(px)]
        worst = max(worst, int(np.abs(ours - theirs).max()))
    assert worst <= TOLERANCE, worst
    page.close()
