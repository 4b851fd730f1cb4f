"""Heatmaps as panels for a browser element that draws them itself (the app's `ui.heatmaps`):
each panel is the values it colours (float32, exactly what the hover shows), its labels, its
title, and its colours as one RGB pixel per cell; one `ColourBar` for a set of panels.

The same colours as the Plotly figures of `attnviz.figures.heatmaps` / `grid` (the PNG, SVG and
PDF downloads): the same scale transform (`colour`), the same pooling past the same cell
budgets, and `vector.raster` (Plotly's interpolation between stops) for the pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attnviz.figures.bins import GRID_MAX_CELLS, GRID_MAX_SIDE, downsample, grid_side
from attnviz.figures.colour import _coloraxis, _colour, _max, resolve_scale
from attnviz.figures.heatmaps import pool_head
from attnviz.figures.labels import bin_labels
from attnviz.figures.vector import raster


@dataclass(frozen=True)
class ColourBar:
    """One colour scale: ``colorscale`` from ``cmin`` to ``cmax``, its title, and its ticks
    ((value, text) pairs; empty: the two ends). ``hover`` names the value in a hover
    ("weight", "log₁₀ weight") and ``digits`` its decimals, as the Plotly figures print it."""

    colorscale: str
    cmin: float
    cmax: float
    title: str
    ticks: tuple[tuple[float, str], ...] = ()
    hover: str = "weight"
    digits: int = 4

    def rgb(self, z: np.ndarray) -> np.ndarray:
        """(…, 3) uint8 colours of ``z`` (NaN white)."""
        return raster(z, self.colorscale, self.cmin, self.cmax)

    def ramp(self, n: int = 256) -> np.ndarray:
        """(1, n, 3) uint8: the scale from ``cmin`` to ``cmax``, left to right."""
        return self.rgb(np.linspace(self.cmin, self.cmax, n, dtype=np.float64)[None, :])


@dataclass(frozen=True, eq=False)
class Panel:
    """One heatmap: ``z`` (query_pos, key_pos) as drawn (after the scale: log₁₀, rank), its
    labels (plain text, "(i) token" or a bin's "(i–j) token…") and its title."""

    title: str
    z: np.ndarray
    q_labels: list[str]
    k_labels: list[str]


def colour_bar(
    scale: str, colorscale: str, zmax: float | None, z: np.ndarray, value: str = "weight"
) -> ColourBar:
    """The colour bar of values ``z`` (raw weights) drawn on ``scale`` ("linear" | "log" | "rank"),
    shared up to ``zmax`` when given (linear), as `head_heatmap` / `head_grid` colour them."""
    mode = resolve_scale(False, scale)
    axis = _coloraxis(colorscale, mode, zmax if zmax is not None else _max(z), title=value)
    bar = axis.get("colorbar", {})
    ticks = tuple(zip(bar.get("tickvals", ()), bar.get("ticktext", ()), strict=True))
    hover, digits = {"rank": (f"{value} rank", 3), "log": (f"log₁₀ {value}", 2)}.get(mode, (value, 4))
    title = bar.get("title", {}).get("text", value)
    return ColourBar(colorscale, float(axis["cmin"]), float(axis["cmax"]), title, ticks, hover, digits)


def head_panel(
    probs: np.ndarray,
    q_labels: Sequence[str],
    k_labels: Sequence[str],
    *,
    title: str,
    scale: str = "linear",
) -> Panel:
    """One head's weights (max-pooled past `SINGLE_MAX_CELLS`, said in the title, as
    `head_heatmap`), drawn on ``scale``."""
    probs, ql, kl, note = pool_head(np.asarray(probs, dtype=np.float32), q_labels, k_labels)
    z = _colour(probs, resolve_scale(False, scale)).astype(np.float32)
    return Panel(title + note, z, list(ql), list(kl))


def grid_panels(
    layer_probs: np.ndarray,
    q_labels: Sequence[str],
    k_labels: Sequence[str],
    titles: Sequence[str],
    *,
    scale: str = "linear",
    max_cells: int = GRID_MAX_CELLS,
    max_side: int = GRID_MAX_SIDE,
) -> list[Panel]:
    """Every head of (heads, query_pos, key_pos), max-pooled to fit ``max_cells`` together (as
    `head_grid`), drawn on ``scale``; one panel per head, titled ``titles``."""
    layer_probs = np.asarray(layer_probs, dtype=np.float32)
    n_h = layer_probs.shape[0]
    side = grid_side(n_h, max_cells, max_side, n_tokens=max(layer_probs.shape[-2:]))
    pooled, re, ce = downsample(layer_probs, side, side, "max")
    ql, kl = bin_labels(q_labels, re), bin_labels(k_labels, ce)
    z = _colour(pooled, resolve_scale(False, scale)).astype(np.float32)
    return [Panel(titles[i], z[i], ql, kl) for i in range(n_h)]
