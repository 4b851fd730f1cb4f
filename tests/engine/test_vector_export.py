"""SVG and PDF export (`attnviz.figures.vector`, issue 40 item 5): heatmaps one pixel per cell in
the figure's own colours, text as text, a 512-token head within 2 MB; the route graph and the
patching map too. Chromium's rendering of the SVG against Plotly's PNG: tests/browser."""

from __future__ import annotations

import base64
import io
import re
import zlib

import numpy as np
import tiny_explain as TE
from PIL import Image
from test_patching import CLEAN, CORRUPT

import attnviz
from attnviz import figures as F
from attnviz.explain import trace
from attnviz.figures import vector as V
from attnviz.figures.vector_pdf import to_pdf


def embedded_images(svg: bytes) -> list[np.ndarray]:
    found = re.findall(rb'href="data:image/png;base64,([^"]+)"', svg)
    return [np.asarray(Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB")) for b in found]


def texts(svg: bytes) -> list[str]:
    return [t.decode() for t in re.findall(rb"<text[^>]*>([^<]*)</text>", svg)]


def head(n: int, seed: int = 0) -> np.ndarray:
    z = np.tril(np.random.default_rng(seed).random((n, n))).astype(np.float32)
    return z / z.sum(-1, keepdims=True)


def test_a_head_is_its_cells_in_its_colours_with_its_labels_as_text():
    z = head(12)
    fig = F.head_heatmap(z, F.token_labels([f"tok{i}" for i in range(12)]), title="m · layer 1 · head 2")
    svg = V.to_svg(fig)
    img, bar = embedded_images(svg)
    assert img.shape == (12, 12, 3)  # one pixel per cell, query 0 on the top row
    axis = fig.layout.coloraxis
    want = V.raster(z, axis.colorscale, axis.cmin, axis.cmax)
    assert np.array_equal(img, want)
    viridis_ends = np.array([[68, 1, 84], [253, 231, 37]])  # Plotly's Viridis at 0 and at 1
    assert np.abs(V.raster(np.array([[0.0, 1.0]]), "Viridis", 0, 1)[0].astype(int) - viridis_ends).max() <= 1
    words = texts(svg)
    assert "m · layer 1 · head 2" in words and "(0) tok0" in words and "(11) tok11" in words
    assert bar.shape[1] == 1  # the colour bar, a vertical ramp


def test_a_512_token_head_is_within_2_mb_and_the_pdf_has_its_text():
    z = head(512, seed=1)  # random weights: the raster compresses worst
    labels = F.token_labels([f"t{i}" for i in range(512)])
    fig = F.head_heatmap(z, labels, title="head 512", max_cells=512 * 512)
    svg = V.to_svg(fig)
    assert len(svg) <= 2 * 2**20, len(svg)
    assert embedded_images(svg)[0].shape == (512, 512, 3)  # unpooled
    pdf = to_pdf(fig)
    assert pdf.startswith(b"%PDF-1.4") and len(pdf) <= 2 * 2**20
    xref = int(pdf.rsplit(b"startxref", 1)[1].split()[0])
    assert pdf[xref:].startswith(b"xref")
    streams = re.findall(rb"stream\n(.*?)\nendstream", pdf, re.S)
    page = next(zlib.decompress(s) for s in streams if b"BT" in zlib.decompress(s))
    assert b"(head 512) Tj" in page and b"/Im0 Do" in page


def test_the_grid_marks_the_open_head_and_keeps_every_title():
    layer = np.stack([head(9, s) for s in range(4)])
    fig = F.head_grid(layer, [str(i) for i in range(9)], open_head=1, facet_px=100, pickable=True)
    svg = V.to_svg(fig, 420)
    assert len(embedded_images(svg)) == 4 + 1  # four tiles and the colour bar
    assert {f"head {h}" for h in range(4)} <= set(texts(svg))
    assert svg.count(b'stroke="#ff2b2b"') == 1  # the open head's frame


def test_the_route_graph_and_the_patching_map_export():
    lm = TE.loaded("llama-gqa")
    graph = attnviz.information_flow(lm, trace(lm, TE.TEXT), threshold=0.02)
    routes = V.to_svg(attnviz.flow_view(graph))
    assert routes.count(b"<polyline") >= len([e for e in graph.edges if e.kind == "attention"])
    assert b"<circle" in routes and to_pdf(attnviz.flow_view(graph)).startswith(b"%PDF")
    res = attnviz.patch(lm, CLEAN, CORRUPT, over="heads_by_position")
    fig = attnviz.patching_view(res)
    svg = V.to_svg(fig)
    (img, *_) = embedded_images(svg)
    hm = fig.data[0]
    assert img.shape[:2] == np.asarray(hm.z).shape
    assert np.array_equal(img, V.raster(np.asarray(hm.z, dtype=float), hm.colorscale, hm.zmin, hm.zmax))
    assert "L0 H0" in texts(svg)
