"""SVG and PDF of a figure, written here (no kaleido, no browser): for papers.

A figure's heatmaps become one embedded raster each (one pixel per cell, drawn without
smoothing: the colours are the figure's own colour scale, `raster`), everything else vector:
titles, tick labels, subplot titles, colour bars, frames, and the route graph's lines, markers
and labels. Text is real text (selectable, searchable); the PDF (`attnviz.figures.vector_pdf`)
uses Helvetica, so a character outside Windows-1252 is written as "?" there (the SVG keeps it).
Rendered by Chromium, every cell has the colour of Plotly's own PNG of the figure within 2/255
(tests/browser/test_vector_browser.py).

Read from the figure: heatmap and scatter traces on their subplots (domains, category or numeric
ranges, reversed axes, square tiles by ``scaleanchor``), the title, annotations, rectangle shapes
on a subplot's domain, the colour axis. Bars, hover and legends are not drawn.
"""

from __future__ import annotations

import base64
import io
import re
from dataclasses import dataclass, field
from html import escape as xml_escape
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.colors import get_colorscale, hex_to_rgb, unlabel_rgb

FONT = "Helvetica, Arial, sans-serif"
INK = "#31333f"
DEFAULT_WIDTH = 800


@dataclass
class Scene:
    """What a figure draws, in pixels from the top left: images, texts, lines, rectangles."""

    width: float
    height: float
    images: list[tuple[float, float, float, float, np.ndarray]] = field(default_factory=list)
    texts: list[tuple[float, float, str, float, str, float]] = field(default_factory=list)  # anchor, angle
    lines: list[tuple[list[tuple[float, float]], str, float]] = field(default_factory=list)
    rects: list[tuple[float, float, float, float, str, float]] = field(default_factory=list)
    dots: list[tuple[float, float, float, str]] = field(default_factory=list)
    ticked: set[str] = field(default_factory=set)  # axes whose tick labels are drawn


def rgb_of(colour: str) -> tuple[int, int, int]:
    colour = colour.strip()
    if colour.startswith("#"):
        return tuple(hex_to_rgb(colour))  # type: ignore[return-value]
    if colour.startswith("rgb"):
        return tuple(round(float(v)) for v in unlabel_rgb(colour)[:3])  # type: ignore[return-value]
    return (0, 0, 0)


def raster(z: np.ndarray, colorscale: Any, cmin: float, cmax: float) -> np.ndarray:
    """(rows, cols, 3) uint8 colours of ``z`` on ``colorscale`` (Plotly's linear interpolation
    between stops, clipped to [cmin, cmax]); NaN is white."""
    stops = get_colorscale(colorscale) if isinstance(colorscale, str) else [list(s) for s in colorscale]
    pos = np.array([float(s[0]) for s in stops])
    rgb = np.array([rgb_of(str(s[1])) for s in stops], dtype=np.float64)
    z = np.asarray(z, dtype=np.float64)
    span = (cmax - cmin) or 1.0
    t = np.clip((np.nan_to_num(z, nan=cmin) - cmin) / span, 0.0, 1.0)
    out = np.stack([np.interp(t, pos, rgb[:, c]) for c in range(3)], axis=-1)
    out[np.isnan(z)] = 255.0
    return np.round(out).astype(np.uint8)


def _plain(text: str) -> list[str]:
    """Plotly's text markup as plain lines (<br> splits; other tags dropped)."""
    import html

    return [html.unescape(re.sub(r"<[^>]+>", "", part)) for part in re.split(r"<br\s*/?>", text or "")]


def _axis(layout: go.Layout, ref: str, letter: str) -> Any:
    return layout[f"{letter}axis{ref[1:]}"]


LABEL_EM = 0.55  # a label's width per character, in font sizes (Helvetica's average)


def _label_px(fig: go.Figure, letter: str) -> float:
    """Room the shown tick labels of every ``letter`` axis take (Plotly's automargin)."""
    widest = 0.0
    for trace in fig.data:
        if trace.type != "heatmap":
            continue
        ax = _axis(fig.layout, (trace.xaxis if letter == "x" else trace.yaxis) or letter, letter)
        labels = ax.ticktext if ax.ticktext is not None else (trace.x if letter == "x" else trace.y)
        if ax.showticklabels is not False and labels is not None:
            widest = max([widest, *(len(_plain(str(t))[0]) * LABEL_EM * 10 + 8 for t in labels)])
    return widest


def _margins(fig: go.Figure) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) px around the plot area, the tick labels and a colour bar
    beside it included (Plotly grows the margins for them)."""
    m = fig.layout.margin
    left, top = m.l if m.l is not None else 80, m.t if m.t is not None else 100
    right, bottom = m.r if m.r is not None else 80, m.b if m.b is not None else 80
    vertical_bar = any(
        (fig.layout[t.coloraxis] if t.coloraxis else t).showscale is not False
        and (fig.layout[t.coloraxis] if t.coloraxis else t).colorbar.orientation != "h"
        for t in fig.data
        if t.type == "heatmap"
    )
    return left + _label_px(fig, "y"), top, right + (90 if vertical_bar else 0), bottom + _label_px(fig, "x")


class _Frame:
    """One subplot's pixel box and its data-to-pixel mapping."""

    def __init__(self, fig: go.Figure, trace: Any, width: float, height: float, n: tuple[int, int] | None):
        lay = fig.layout
        left, top, right, bottom = _margins(fig)
        plot_w, plot_h = width - left - right, height - top - bottom
        self.xa, self.ya = _axis(lay, trace.xaxis or "x", "x"), _axis(lay, trace.yaxis or "y", "y")
        dx, dy = self.xa.domain or (0, 1), self.ya.domain or (0, 1)
        self.x0, self.x1 = left + dx[0] * plot_w, left + dx[1] * plot_w
        self.y0, self.y1 = top + (1 - dy[1]) * plot_h, top + (1 - dy[0]) * plot_h
        self.xr = self._range(self.xa, n[1] if n else None, trace.x)
        self.yr = self._range(self.ya, n[0] if n else None, trace.y)
        if self.ya.autorange == "reversed" and self.ya.range is None:
            self.yr = (self.yr[1], self.yr[0])
        if self.ya.scaleanchor and n:  # square cells: shrink the longer side, centred
            per = min(
                (self.x1 - self.x0) / abs(self.xr[1] - self.xr[0]),
                (self.y1 - self.y0) / abs(self.yr[1] - self.yr[0]),
            )
            cx, cy = (self.x0 + self.x1) / 2, (self.y0 + self.y1) / 2
            hw, hh = per * abs(self.xr[1] - self.xr[0]) / 2, per * abs(self.yr[1] - self.yr[0]) / 2
            self.x0, self.x1, self.y0, self.y1 = cx - hw, cx + hw, cy - hh, cy + hh

    @staticmethod
    def _range(axis: Any, n: int | None, data: Any) -> tuple[float, float]:
        if axis.range is not None:
            return float(axis.range[0]), float(axis.range[1])
        if n is not None:
            return -0.5, n - 0.5
        vals = np.asarray([v for v in (data or []) if isinstance(v, int | float)], dtype=float)
        lo, hi = (float(vals.min()), float(vals.max())) if vals.size else (0.0, 1.0)
        pad = (hi - lo) * 0.05 or 0.5
        return lo - pad, hi + pad

    def px(self, x: float, y: float) -> tuple[float, float]:
        fx = (x - self.xr[0]) / (self.xr[1] - self.xr[0])
        fy = (y - self.yr[0]) / (self.yr[1] - self.yr[0])
        return self.x0 + fx * (self.x1 - self.x0), self.y1 - fy * (self.y1 - self.y0)


def _colours(fig: go.Figure, trace: Any, z: np.ndarray) -> tuple[Any, float, float, Any]:
    """(colorscale, cmin, cmax, the colour axis or trace that holds the colour bar)."""
    if trace.coloraxis:
        ax = fig.layout[trace.coloraxis]
        lo = ax.cmin if ax.cmin is not None else float(np.nanmin(z))
        hi = ax.cmax if ax.cmax is not None else float(np.nanmax(z))
        return ax.colorscale or "Viridis", float(lo), float(hi), ax
    lo = trace.zmin if trace.zmin is not None else float(np.nanmin(z))
    hi = trace.zmax if trace.zmax is not None else float(np.nanmax(z))
    if trace.zmid is not None and trace.zmin is None:
        bound = max(abs(lo - trace.zmid), abs(hi - trace.zmid))
        lo, hi = trace.zmid - bound, trace.zmid + bound
    return trace.colorscale or "Viridis", float(lo), float(hi), trace


def scene_of(fig: go.Figure, width: int = DEFAULT_WIDTH) -> Scene:
    """What ``fig`` draws at ``width`` px (its own height, else 500)."""
    fig = go.Figure(fig)  # validated: defaults filled, colour scales as stops
    height = float(fig.layout.height or 500)
    s = Scene(float(width), height)
    bars: dict[int, tuple[Any, Any, float, float]] = {}
    for trace in fig.data:
        if trace.type == "heatmap" and trace.z is not None:
            z = np.asarray(trace.z, dtype=float)
            f = _Frame(fig, trace, width, height, z.shape)
            cs, lo, hi, holder = _colours(fig, trace, z)
            img = raster(z, cs, lo, hi)
            flip_y, flip_x = f.yr[0] > f.yr[1], f.xr[0] > f.xr[1]
            img = img[::-1] if not flip_y else img  # row 0 at the bottom unless the axis is reversed
            img = img[:, ::-1] if flip_x else img
            s.images.append((f.x0, f.y0, f.x1 - f.x0, f.y1 - f.y0, img))
            _ticks(s, f, trace, z.shape)
            if getattr(holder, "showscale", None) is not False:
                bars.setdefault(id(holder), (holder, cs, lo, hi))
        elif trace.type == "scatter" and trace.x is not None and trace.visible is not False:
            _scatter(s, fig, trace, width, height)
    for holder, cs, lo, hi in bars.values():
        _colour_bar(s, fig, holder, cs, lo, hi)
    _annotations(s, fig, width, height)
    return s


def _ticks(s: Scene, f: _Frame, trace: Any, shape: tuple[int, int]) -> None:
    """Category tick labels where the figure shows them."""
    size = 10.0
    for ax, labels, horizontal in ((f.xa, trace.x, True), (f.ya, trace.y, False)):
        if ax.showticklabels is False or labels is None:
            continue
        vals = list(ax.tickvals) if ax.tickvals is not None else list(labels)
        text = list(ax.ticktext) if ax.ticktext is not None else [str(v) for v in vals]
        index = {str(v): i for i, v in enumerate(labels)}
        if len(vals) > 64:  # Plotly thins a long axis; so does this
            step = len(vals) // 32
            vals, text = vals[::step], text[::step]
        for v, t in zip(vals, text, strict=False):
            i = index.get(str(v))
            if i is None:
                continue
            label = _plain(str(t))[0]
            if horizontal:
                x, _ = f.px(i, 0)
                s.texts.append(
                    (x, f.y1 + 4, label, size, "end", -90.0 if ax.tickangle in (-90, 90) else -60.0)
                )
            else:
                _, y = f.px(0, i)
                s.texts.append((f.x0 - 4, y + size / 3, label, size, "end", 0.0))


def _value_ticks(s: Scene, f: _Frame, trace: Any) -> None:
    """A numeric axis's own tick labels (``tickvals`` / ``ticktext``: the route graph's tokens
    and layers), once per axis."""
    for ax, name, horizontal in ((f.xa, trace.xaxis or "x", True), (f.ya, trace.yaxis or "y", False)):
        if name in s.ticked or ax.tickvals is None or ax.showticklabels is False:
            continue
        s.ticked.add(name)
        text = list(ax.ticktext) if ax.ticktext is not None else [f"{v:g}" for v in ax.tickvals]
        for v, t in zip(ax.tickvals, text, strict=False):
            label = _plain(str(t))[0]
            if horizontal:
                x, _ = f.px(float(v), f.yr[0])
                s.texts.append((x, f.y1 + 6, label, 10.0, "end", float(ax.tickangle or 0) or -45.0))
            else:
                _, y = f.px(f.xr[0], float(v))
                s.texts.append((f.x0 - 6, y + 3, label, 10.0, "end", 0.0))


def _scatter(s: Scene, fig: go.Figure, trace: Any, width: float, height: float) -> None:
    f = _Frame(fig, trace, width, height, None)
    _value_ticks(s, f, trace)
    mode = trace.mode or "lines+markers"
    pts = [
        None if x is None or y is None else f.px(float(x), float(y))
        for x, y in zip(trace.x, trace.y, strict=False)
        if x is None or isinstance(x, int | float)
    ]
    colour = (trace.line.color if "lines" in mode else trace.marker.color) or INK
    if "lines" in mode:
        run: list[tuple[float, float]] = []
        for p in [*pts, None]:
            if p is None:
                if len(run) > 1:
                    s.lines.append((run, str(trace.line.color or INK), float(trace.line.width or 2)))
                run = []
            else:
                run.append(p)
    if "markers" in mode and (trace.marker.opacity is None or trace.marker.opacity > 0):
        size = trace.marker.size if isinstance(trace.marker.size, int | float) else 6
        colours = trace.marker.color
        for i, p in enumerate(pts):
            if p is not None:
                c = colours[i] if isinstance(colours, list | tuple) else (colours or colour)
                s.dots.append((p[0], p[1], float(size) / 2, str(c)))
    if "text" in mode and trace.text is not None:
        texts = trace.text if isinstance(trace.text, list | tuple) else [trace.text] * len(pts)
        for p, t in zip(pts, texts, strict=False):
            if p is not None and t:
                s.texts.append((p[0], p[1] - 8, _plain(str(t))[0], 10.0, "middle", 0.0))


def _colour_bar(s: Scene, fig: go.Figure, holder: Any, cs: Any, lo: float, hi: float) -> None:
    """A gradient strip (raster) with its two end values and title (vector)."""
    bar = holder.colorbar
    ramp = np.linspace(lo, hi, 64)
    title = _plain(bar.title.text or "")[0] if bar and bar.title else ""
    if bar and bar.orientation == "h":
        w, h = s.width * 0.6, 10.0
        x, y = (s.width - w) / 2, s.height - 26
        s.images.append((x, y, w, h, raster(ramp[None, :], cs, lo, hi)))
        s.texts += [
            (x, y + h + 11, f"{lo:.3g}", 10.0, "start", 0.0),
            (x + w, y + h + 11, f"{hi:.3g}", 10.0, "end", 0.0),
        ]
        s.texts.append((x - 6, y + h, title, 11.0, "end", 0.0))
        return
    w, h = 14.0, min(200.0, s.height * 0.5)
    x, y = s.width - 60, (s.height - h) / 2
    s.images.append((x, y, w, h, raster(ramp[::-1, None], cs, lo, hi)))
    s.texts += [
        (x + w + 4, y + 8, f"{hi:.3g}", 10.0, "start", 0.0),
        (x + w + 4, y + h, f"{lo:.3g}", 10.0, "start", 0.0),
    ]
    s.texts.append((x, y - 8, title, 11.0, "start", 0.0))


def _annotations(s: Scene, fig: go.Figure, width: float, height: float) -> None:
    lay = fig.layout
    left, top, right, bottom = _margins(fig)
    plot_w, plot_h = width - left - right, height - top - bottom
    if lay.title and lay.title.text:
        for i, line in enumerate(_plain(lay.title.text)):
            s.texts.append((10, 18 + 16 * i, line, 14.0, "start", 0.0))
    for a in lay.annotations or ():
        if a.xref == "paper" and a.yref == "paper" and a.text:
            x, y = left + float(a.x) * plot_w, top + (1 - float(a.y)) * plot_h
            s.texts.append((x, y - 4, _plain(a.text)[0], float(a.font.size or 11), "middle", 0.0))
    for shape in lay.shapes or ():
        if shape.type == "rect" and str(shape.xref).endswith(" domain"):
            tr = go.Heatmap(xaxis=shape.xref.split()[0], yaxis=shape.yref.split()[0])
            f = _Frame(fig, tr, width, height, (1, 1))
            w, h = f.x1 - f.x0, f.y1 - f.y0
            x0, x1 = f.x0 + float(shape.x0) * w, f.x0 + float(shape.x1) * w
            y0, y1 = f.y1 - float(shape.y1) * h, f.y1 - float(shape.y0) * h
            s.rects.append(
                (x0, y0, x1 - x0, y1 - y0, str(shape.line.color or INK), float(shape.line.width or 1))
            )


def png_bytes(img: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img, "RGB").save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def to_svg(fig: go.Figure, width: int = DEFAULT_WIDTH) -> bytes:
    """``fig`` as a standalone SVG: heatmaps as embedded PNGs (one pixel per cell, unsmoothed),
    text as <text> (selectable). PDF: `attnviz.figures.vector_pdf.to_pdf`."""
    s = scene_of(fig, width)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{s.width:.0f}" height="{s.height:.0f}" '
        f'viewBox="0 0 {s.width:.0f} {s.height:.0f}" font-family="{FONT}">',
        f'<rect width="{s.width:.0f}" height="{s.height:.0f}" fill="#fff"/>',
    ]
    for x, y, w, h, img in s.images:
        data = base64.b64encode(png_bytes(img)).decode()
        out.append(
            f'<image x="{x:.2f}" y="{y:.2f}" width="{w:.2f}" height="{h:.2f}" preserveAspectRatio="none" '
            'style="image-rendering:pixelated;image-rendering:optimizeSpeed" '
            f'href="data:image/png;base64,{data}"/>'
        )
    for pts, colour, lw in s.lines:
        d = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        out.append(f'<polyline points="{d}" fill="none" stroke="{colour}" stroke-width="{lw:g}"/>')
    for cx, cy, r, colour in s.dots:
        out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{r:.1f}" fill="{colour}"/>')
    for x, y, w, h, colour, lw in s.rects:
        out.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="none" '
            f'stroke="{colour}" stroke-width="{lw:g}"/>'
        )
    for x, y, text, size, anchor, angle in s.texts:
        rot = f' transform="rotate({angle:g} {x:.1f} {y:.1f})"' if angle else ""
        out.append(
            f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size:g}" fill="{INK}" text-anchor="{anchor}"{rot} '
            f'xml:space="preserve">{xml_escape(text)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out).encode()
