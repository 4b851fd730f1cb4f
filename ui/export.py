"""Charts with a named PNG camera button, and NPZ / CSV / HTML / SVG / PDF downloads of what is
shown (SVG and PDF: `attnviz.figures.vector`, heatmaps as embedded rasters, text selectable)."""

from __future__ import annotations

import csv
import hashlib
import html
import io
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
import streamlit as st
from plotly.utils import PlotlyJSONEncoder

from attnviz import limits
from attnviz.figures import vector, vector_pdf

HTML_PLOTLYJS: bool | str = True  # embed plotly.js: the file opens offline


def revision(fig: go.Figure) -> str:
    """A digest of the figure's data, for ``layout.datarevision``: with it unchanged, Plotly.react
    in the browser keeps the drawn data and only applies what else changed (the grid's frame
    after a head change is a shape, not a redraw of nine heatmaps)."""
    data = json.dumps(fig.to_plotly_json()["data"], cls=PlotlyJSONEncoder)
    return hashlib.blake2b(data.encode(), digest_size=12).hexdigest()


def vector_buttons(
    fig: go.Figure | Callable[[], go.Figure], name: str, *, key: str, columns: Sequence[Any] = ()
) -> None:
    """ "⬇ SVG" and "⬇ PDF" of ``fig`` (a figure or a callable that builds it), made when clicked;
    in ``columns`` (two) when given, else in two new columns."""
    build = fig if callable(fig) else (lambda: fig)
    formats = (
        ("SVG", vector.to_svg, "svg", "image/svg+xml",
         "For papers: a vector file, text selectable, each heatmap one pixel per cell (no smoothing)."),
        ("PDF", vector_pdf.to_pdf, "pdf", "application/pdf",
         "For papers: one PDF page, text selectable (Helvetica: characters outside Latin-1 show as ?)."),
    )  # fmt: skip
    for column, (label, convert, ext, mime, tip) in zip(columns or st.columns(2), formats, strict=True):
        column.download_button(
            f"⬇ {label}",
            data=lambda convert=convert: convert(build()),
            file_name=f"{name}.{ext}",
            mime=mime,
            key=f"{key}_{ext}",
            on_click="ignore",
            help=tip,
        )


def chart(
    fig: go.Figure,
    name: str,
    *,
    key: str | None = None,
    on_select: bool | Callable[[], None] = False,
    vector_key: str | None = None,
) -> Any:
    """``st.plotly_chart`` whose camera button saves ``<name>.png`` at 2x. ``on_select``: a click
    on a point is a selection event (returned; needs ``key``); a callable runs on the click
    before the rerun (it reads ``st.session_state[key]``). ``vector_key``: SVG and PDF download
    buttons under the chart (`vector_buttons`)."""
    fig.update_layout(datarevision=revision(fig))
    if vector_key:
        event = chart(fig, name, key=key, on_select=on_select)
        vector_buttons(fig, name, key=vector_key)
        return event
    return st.plotly_chart(
        fig,
        key=key,
        on_select=(on_select if callable(on_select) else "rerun") if on_select else "ignore",
        selection_mode="points",
        config={
            "displaylogo": False,
            "toImageButtonOptions": {"format": "png", "filename": name, "scale": 2},
        },
    )


def npz_bytes(**arrays: object) -> bytes:
    buf = io.BytesIO()
    named: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in arrays.items()}
    np.savez_compressed(buf, **named)  # type: ignore[arg-type]  # numpy's stub types **kwds oddly
    return buf.getvalue()


def csv_text(matrix: np.ndarray, row_labels: Sequence[str], col_labels: Sequence[str], corner: str) -> str:
    """A labelled matrix as CSV: first row the key labels, first column the query labels."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([corner, *col_labels])
    for label, row in zip(row_labels, np.asarray(matrix), strict=True):
        w.writerow([label, *(f"{x:.6g}" for x in row)])
    return buf.getvalue()


def html_bytes(fig: go.Figure, *, offline: bool = False) -> bytes:
    """One figure as a standalone HTML file: plotly.js from its CDN (the figure's own size; a
    one-head file with plotly.js inside was 4.8 MB), or inside it with ``offline``."""
    return fig.to_html(include_plotlyjs=HTML_PLOTLYJS if offline else "cdn", full_html=True).encode()


def html_page(figs: Sequence[go.Figure], title: str, *, cdn: bool = False) -> bytes:
    """Several figures in one standalone HTML file that carries plotly.js once (~4.6 MB), or
    loads it from the CDN (``cdn=True``: a few hundred KB, needs a network to open)."""
    parts = [
        f.to_html(include_plotlyjs=("cdn" if cdn else True) if i == 0 else False, full_html=False)
        for i, f in enumerate(figs)
    ]
    head = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body>"
    )
    return (head + "\n".join(parts) + "</body></html>").encode()


def html_buttons(figs: Callable[[], Sequence[go.Figure]], name: str, *, key: str, what: str) -> None:
    """Two downloads of ``figs()`` as one HTML page: offline (plotly.js inside once) and small (CDN);
    SVG and PDF of the first figure."""
    c1, c2 = st.columns(2)
    c1.download_button(
        f"⬇ HTML: {what}",
        data=lambda: html_page(figs(), name),
        file_name=f"{name}.html",
        mime="text/html",
        key=f"{key}_html_all",
        on_click="ignore",
        help="One standalone file with plotly.js inside once (opens offline).",
    )
    c2.download_button(
        "⬇ HTML (small, CDN)",
        data=lambda: html_page(figs(), name, cdn=True),
        file_name=f"{name}_cdn.html",
        mime="text/html",
        key=f"{key}_html_cdn",
        on_click="ignore",
        help="The same page loading plotly.js from its CDN: far smaller, needs a network to open.",
    )
    vector_buttons(lambda: figs()[0], name, key=key)  # a row of their own: no label cut short


def downloads(
    name: str,
    *,
    npz: Callable[[], bytes],
    csv: Callable[[], str],
    fig: go.Figure | Callable[[], go.Figure],
    key: str,
    what: str = "attention",
    shape: tuple[int, int] | None = None,
) -> None:
    """Three download buttons (data made only when clicked; no rerun).

    The callables outlive the run (Streamlit keeps them until the session ends): they should hold
    a `ui.models.ResultRef` and small values, never a result (see `ui.models`). ``fig`` may be a
    callable that rebuilds the figure. ``shape`` (rows, cols) of the NPZ's matrix: past the
    engine's download limit the NPZ button is disabled and a caption says what to use instead."""
    build = fig if callable(fig) else (lambda: fig)
    refused = None if shape is None else limits.download_refusal(*shape, "npz")
    c1, c2, c3 = st.columns(3)
    c1.download_button(
        "⬇ NPZ",
        data=b"" if refused else npz,
        disabled=refused is not None,
        file_name=f"{name}.npz",
        mime="application/octet-stream",
        key=f"{key}_npz",
        on_click="ignore",
        help=refused or f"The {what} as float32 arrays with the tokens (numpy.load).",
    )
    c2.download_button(
        "⬇ CSV",
        data=csv,
        file_name=f"{name}.csv",
        mime="text/csv",
        key=f"{key}_csv",
        on_click="ignore",
        help=f"The {what} as a table: one row per query token, one column per key token.",
    )
    c3.download_button(
        "⬇ HTML",
        data=lambda: html_bytes(build()),
        file_name=f"{name}.html",
        mime="text/html",
        key=f"{key}_html",
        on_click="ignore",
        help="This figure as a small interactive HTML file that loads plotly.js from its CDN (needs a "
        "network to open; the layer grid's HTML buttons also offer an offline file).",
    )
    vector_buttons(build, name, key=key, columns=st.columns(3)[:2])  # five in a row cut "⬇ HTML" short
    if refused:
        st.caption(refused[0].upper() + refused[1:] + ".")
