"""Token and axis labels, titles and file names (all user text HTML-escaped)."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np

ALL_TICKS_MAX = 48  # token axes with up to this many labels show every one
TITLE_MARGIN = 76  # px above the plot area: the mode bar (~30 px) and the title below it


def escape(text: str) -> str:
    """``<``, ``>`` and ``&`` as HTML entities, so Plotly shows the text literally."""
    return html.escape(str(text), quote=False)


def token_labels(display: Sequence[str], positions: Sequence[int] | None = None) -> list[str]:
    """``"(i) token"`` per position (plain text; builders escape). ``positions`` keeps the
    original positions when some tokens are hidden."""
    pos = range(len(display)) if positions is None else positions
    return [f"({int(p)}) {d}" for p, d in zip(pos, display, strict=True)]


def _label_parts(label: str) -> tuple[str, str]:
    """ "(12) bank" -> ("12", "bank"); any other label -> ("", label)."""
    if label.startswith("(") and ") " in label:
        head, text = label[1:].split(") ", 1)
        return head, text
    return "", label


def bin_labels(labels: Sequence[str], edges: np.ndarray) -> list[str]:
    """One label per bin: the label itself for a one-token bin, else ``"(i–j) first…"``."""
    n = len(labels)
    stops = [*edges[1:].tolist(), n]
    out = []
    for a, b in zip(edges.tolist(), stops, strict=True):
        if b - a == 1:
            out.append(labels[a])
            continue
        first, text = _label_parts(labels[a])
        last, _ = _label_parts(labels[b - 1])
        out.append(f"({first}–{last}) {text}…" if first and last else f"[{a}–{b - 1}] {text}…")
    return out


def head_title(head: int, kv_head: int | None = None) -> str:
    """ "head 4 · kv 1" (GQA) or "head 4"."""
    return f"head {head}" if kv_head is None else f"head {head} · kv {kv_head}"


def token_ticks(labels: Sequence[str]) -> dict:
    """Axis settings that show every label of a short category axis (``labels`` as given to
    the trace, i.e. escaped); {} for a long one, which Plotly thins."""
    n = len(labels)
    if n == 0 or n > ALL_TICKS_MAX:
        return {}
    size = 12 if n <= 16 else (10 if n <= 32 else 9)
    return dict(tickmode="array", tickvals=list(labels), ticktext=list(labels), tickfont=dict(size=size))


def index_ticks(values: Sequence[str], max_labels: int = 16) -> tuple[list[str], list[str]]:
    """(tickvals, ticktext) for a numbered category axis (layers): every 1st, 2nd, 5th, 10th ...
    value so that at most ``max_labels`` show, labelled with their index."""
    n = len(values)
    step = next((s for s in (1, 2, 5, 10, 20, 50, 100, 200) if n / s <= max_labels), max(1, n // max_labels))
    picked = list(range(0, n, step))
    return [values[i] for i in picked], [str(i) for i in picked]


def _title(text: str, size: int = 14) -> dict:
    """A left-aligned title just above the plot area (clear of the mode bar on the right).
    Plotly anchors a title's first line and sets the lines after each ``<br>`` below it, over the
    plot (the patching map's second line hid row L0): the padding lifts it by those lines
    (Plotly's line height is 1.3 em; ``automargin`` did not move them)."""
    extra = text.count("<br>")
    return dict(
        text=text,
        x=0,
        xref="paper",
        xanchor="left",
        y=1,
        yref="paper",
        yanchor="bottom",
        pad=dict(b=10 + round(extra * 1.3 * size)),
        font=dict(size=size),
    )


def figure_name(*parts: object) -> str:
    """A file name stem like ``attnviz_smollm2-135m_L3_H0`` (no path separators, no spaces)."""
    text = "_".join(str(p) for p in ("attnviz", *parts) if p not in (None, ""))
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)[:120]
