"""Heatmaps drawn by the browser once, without Plotly: one `st.components.v2` element (inline JS and
CSS in ui/heatmaps.js / .css, no build step) for the Explorer's layer grid and big head, and any
page's grid of heads.

API (the panels come from `attnviz.figures.panels`):

- ``show(panels, bar, key=..., title=..., cols=, tile_px=, open_index=, click=, preview=, name=)``
  draws them: each panel a PNG made here (one pixel per cell, scaled without smoothing: the
  colours of `panels.ColourBar.rgb`, the PNG/SVG/PDF downloads' own), its title, token labels
  where they fit (`attnviz.figures.labels_fit`), one colour bar, and a hover with the cell's exact
  value (the panel's float32 values ship with it) and its query and key tokens. ``click="panel"``
  or ``"cell"`` makes a click an event (read with `clicked`); ``open_index`` frames a panel;
  ``preview`` shows a hovered panel enlarged. A "⬇ PNG" button saves the view at 2x.
- ``clicked(key)``: a new click on element ``key`` ({"panel", "row", "col"}), readable before the
  element is drawn in the run the click started, once.
- ``mark(key, index)``: frame panel ``index`` of element ``key`` drawn earlier (e.g. by an outer
  fragment that does not rerun), without sending the panels again.

`figure(data)` reads an element's data back (tests, the page-cost checks).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import streamlit as st

from attnviz import figures as F
from attnviz.figures import vector
from attnviz.figures.panels import ColourBar, Panel
from ui import state

NAME = "attnviz_heatmaps"
PREVIEW_PX = 300  # an enlarged panel's side at least (else twice the tile, within the window)
_HERE = Path(__file__).resolve().parent
_component: Any = None


def _mount() -> Any:
    global _component
    if _component is None:  # registered once per process, on first use (never at import)
        js, css = (_HERE / "heatmaps.js").read_text(), (_HERE / "heatmaps.css").read_text()
        _component = st.components.v2.component(NAME, js=js, css=css, isolate_styles=False)
    return _component


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _png(rgb: np.ndarray) -> str:
    return _b64(vector.png_bytes(np.ascontiguousarray(rgb)))


def payload(
    panels: Sequence[Panel],
    bar: ColourBar,
    *,
    key: str,
    title: str = "",
    cols: int = 1,
    tile_px: int = 400,
    labels: bool | None = None,
    axes: bool = False,
    open_index: int | None = None,
    click: Literal["panel", "cell"] | None = None,
    preview: bool = False,
    name: str = "heatmap",
    colorbar: bool = True,
    col_titles: Sequence[str] | None = None,
    row_titles: Sequence[str] | None = None,
) -> dict:
    """The element's data (see the module's docstring; ``labels`` None: where they fit).
    ``col_titles`` / ``row_titles`` (a mosaic of small tiles): a title per column above the
    first row and per row beside the first column, instead of one over each panel (the hover,
    the preview and the PNG still name each panel by its own title)."""
    if not panels:
        raise ValueError("no panels to draw")
    shared = all(p.q_labels is panels[0].q_labels and p.k_labels is panels[0].k_labels for p in panels)
    n_bins = max(max(p.z.shape) for p in panels)
    items = []
    for p in panels:
        z = np.ascontiguousarray(p.z, dtype="<f4")
        item = {
            "title": p.title,
            "rows": int(z.shape[0]),
            "cols": int(z.shape[1]),
            "png": _png(bar.rgb(z)),
            "values": _b64(z.tobytes()),
        }
        if not shared:
            item |= {"q": list(p.q_labels), "k": list(p.k_labels)}
        items.append(item)
    data: dict[str, Any] = {
        "id": key,
        "title": title,
        "cols": int(cols),
        "tile": int(tile_px),
        "labels": F.labels_fit(n_bins, tile_px) if labels is None else bool(labels),
        "axes": bool(axes),
        "bar": {
            "png": _png(bar.ramp()),
            "cmin": bar.cmin,
            "cmax": bar.cmax,
            "title": bar.title,
            "ticks": [[float(v), str(t)] for v, t in bar.ticks],
            "hover": bar.hover,
            "digits": bar.digits,
            "colorscale": bar.colorscale,
        },
        "panels": items,
        "click": click,
        "preview": bool(preview),
        "colorbar": bool(colorbar),
        "preview_px": PREVIEW_PX,
        "name": name,
    }
    if shared:
        data |= {"q": list(panels[0].q_labels), "k": list(panels[0].k_labels)}
    if col_titles is not None:
        data["col_titles"] = list(col_titles)
    if row_titles is not None:
        data["row_titles"] = list(row_titles)
    # the browser draws again only when this changes (not for a new frame: `open`)
    data["rev"] = hashlib.blake2b(json.dumps(data, sort_keys=True).encode(), digest_size=12).hexdigest()
    data["open"] = open_index
    return data


def show(panels: Sequence[Panel], bar: ColourBar, *, key: str, **options: Any) -> None:
    """Draw ``panels`` with colour bar ``bar`` as element ``key`` (options: `payload`)."""
    data = payload(panels, bar, key=key, **options)
    callbacks = {"on_click_change": _noop} if data["click"] else {}
    _mount()(data=data, key=key, height="content", **callbacks)


def _noop() -> None:
    """A click is read by `clicked` before the element is drawn again."""


def clicked(key: str) -> dict | None:
    """A new click on element ``key`` ({"panel", "row", "col"}; row and col in the panel's cells),
    or None: each click is read once (a later rerun of the same run's state does not repeat it)."""
    value = state.widget_value(key)
    try:
        click = value.get("click") if value is not None else None
    except AttributeError:
        click = None
    if not isinstance(click, dict) or "panel" not in click:
        return None
    seen = state.kept("seen_clicks", {})
    if seen.get(key) == repr(click):
        return None
    seen[key] = repr(click)
    return {k: int(click[k]) for k in ("panel", "row", "col") if k in click}


def mark(key: str, index: int | None) -> None:
    """Frame panel ``index`` of element ``key`` (drawn in this page by `show`) in the browser."""
    _mount()(data={"mark": key, "index": index}, key=f"{key}_mark", height="content")


def figure(data: dict) -> dict:
    """An element's data as a figure-like dict (what it draws: "title", "bar", and per panel its
    title, ``z`` as drawn (float32), labels): for tests and cost checks."""
    panels = []
    for p in data["panels"]:
        z = np.frombuffer(base64.b64decode(p["values"]), dtype="<f4").reshape(p["rows"], p["cols"])
        q, k = p.get("q", data.get("q")), p.get("k", data.get("k"))
        panels.append({"title": p["title"], "z": z, "q": q, "k": k})
    kept = ("title", "bar", "labels", "click", "name", "rev")
    return {**{name: data[name] for name in kept}, "panels": panels, "open": data.get("open")}
