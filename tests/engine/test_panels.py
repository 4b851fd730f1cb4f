"""The browser-drawn heatmaps' panels (`attnviz.figures.panels`) draw what the Plotly figures of
the downloads draw: the same values (after the scale), the same pooling and labels, the same
colour range and colours."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz import figures as F
from attnviz.figures import panels as P
from attnviz.figures.vector import raster


def _rows(rng: np.random.Generator, *shape: int) -> np.ndarray:
    x = rng.random(shape).astype(np.float32)
    return x / x.sum(-1, keepdims=True)


@pytest.mark.parametrize("scale", ["linear", "log", "rank"])
def test_a_head_panel_is_the_head_heatmaps_values_and_colour_range(scale):
    rng = np.random.default_rng(0)
    probs = _rows(rng, 7, 9)
    q, k = [f"({i}) q" for i in range(7)], [f"({i}) k" for i in range(9)]
    fig = F.head_heatmap(probs, q, k, title="t", scale=scale, zmax=0.5)
    panel = P.head_panel(probs, q, k, title="t", scale=scale)
    bar = P.colour_bar(scale, "Viridis", 0.5, probs)
    np.testing.assert_array_equal(panel.z, np.asarray(fig.data[0].z, dtype=np.float32))
    assert (bar.cmin, bar.cmax) == (fig.layout.coloraxis.cmin, fig.layout.coloraxis.cmax)
    assert panel.q_labels == q and panel.k_labels == k
    # the hover names the value as the Plotly hover does
    assert bar.hover in fig.data[0].hovertemplate and f":.{bar.digits}f" in fig.data[0].hovertemplate


def test_a_long_head_is_pooled_as_the_figure_pools_it_and_says_so():
    rng = np.random.default_rng(1)
    probs = _rows(rng, 700, 700)
    labels = [f"({i}) t" for i in range(700)]
    fig = F.head_heatmap(probs, labels, labels, title="head")
    panel = P.head_panel(probs, labels, labels, title="head")
    np.testing.assert_array_equal(panel.z, np.asarray(fig.data[0].z, dtype=np.float32))
    assert "max-pooled to" in panel.title and panel.q_labels == list(fig.data[0].y)


def test_grid_panels_are_the_grids_tiles_and_the_colours_are_the_scales():
    rng = np.random.default_rng(2)
    layer = _rows(rng, 4, 150, 150)
    labels = [f"({i}) t" for i in range(150)]
    titles = [F.head_title(h) for h in range(4)]
    fig = F.head_grid(layer, labels, labels, zmax=0.2)
    panels = P.grid_panels(layer, labels, labels, titles)
    heat = [t for t in fig.data if t.type == "heatmap"]
    assert len(panels) == len(heat) == 4
    for p, t in zip(panels, heat, strict=True):
        np.testing.assert_array_equal(p.z, np.asarray(t.z, dtype=np.float32))
        assert p.title == t.name
    bar = P.colour_bar("linear", "Magma", 0.2, layer)
    np.testing.assert_array_equal(bar.rgb(panels[0].z), raster(panels[0].z, "Magma", 0.0, 0.2))
    ramp = bar.ramp(5)[0]
    np.testing.assert_array_equal(ramp[0], raster(np.array([[0.0]]), "Magma", 0.0, 0.2)[0, 0])
    np.testing.assert_array_equal(ramp[-1], raster(np.array([[0.2]]), "Magma", 0.0, 0.2)[0, 0])
