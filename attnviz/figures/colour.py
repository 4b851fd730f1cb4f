"""Colour scales and the shared colour axis: linear weights, log10 weights or rank (percentile).

One view draws with one scale: pages pass the same ``zmax`` (linear) to the grid and the big
head, so a colour means the same weight in both. Long texts spread every row over N keys, so
a linear scale shows ~1/N everywhere (an all-dark map); `default_scale` picks log past
`LONG_TEXT_TOKENS` tokens and `scale_note` says so.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

ColorScale = Literal["Viridis", "Magma", "Inferno", "Cividis", "Blues", "Greys"]
COLORSCALES: tuple[str, ...] = get_args(ColorScale)
Scale = Literal["linear", "log", "rank"]
SCALES: tuple[str, ...] = get_args(Scale)
DIVERGING = "RdBu_r"
LOG_FLOOR_EXP = -5  # log colour: weights below 1e-5 share the lowest colour
LONG_TEXT_TOKENS = 300  # past this many tokens the default scale is log


def default_scale(n_tokens: int) -> Scale:
    """linear for short texts, log past `LONG_TEXT_TOKENS` (where linear looks empty)."""
    return "log" if n_tokens > LONG_TEXT_TOKENS else "linear"


def scale_note(scale: str, n_tokens: int) -> str:
    """One sentence for the page when the scale is not plain linear weights ("" otherwise)."""
    if scale == "log":
        why = (
            f" ({n_tokens} tokens: each weight is ~1/{n_tokens} on average)"
            if n_tokens > LONG_TEXT_TOKENS
            else ""
        )
        return f"Colour is log₁₀ of the weight{why}; weights below 1e{LOG_FLOOR_EXP} share the lowest colour."
    if scale == "rank":
        return "Colour is the weight's rank among the weights drawn (percentile), not the weight itself."
    return ""


def resolve_scale(log: bool, scale: str | None) -> Scale:
    """The scale a builder draws with: ``scale`` when given, else log/linear from ``log``."""
    if scale is None:
        return "log" if log else "linear"
    if scale not in SCALES:
        raise ValueError(f"unknown colour scale {scale!r}; use one of {SCALES}")
    return scale  # type: ignore[return-value]


def rank_values(z: np.ndarray) -> np.ndarray:
    """Each value's percentile (0..1] among the positive values of ``z``; zeros and NaN stay 0 / NaN."""
    z = np.asarray(z, dtype=np.float32)
    out = np.zeros_like(z)
    pos = np.isfinite(z) & (z > 0)
    vals = z[pos]
    if vals.size:
        order = np.argsort(vals, kind="stable")
        ranks = np.empty(vals.size, dtype=np.float32)
        ranks[order] = np.arange(1, vals.size + 1, dtype=np.float32) / vals.size
        out[pos] = ranks
    out[~np.isfinite(z)] = np.nan
    return out


def _colour(z: np.ndarray, log: bool | str) -> np.ndarray:
    """Values to colour: ``log`` True/"log" gives clipped log10, "rank" percentiles, else ``z``."""
    if log == "rank":
        return rank_values(z)
    if log is False or log == "linear":
        return z
    out = np.log10(np.maximum(z, 10.0**LOG_FLOOR_EXP)).astype(np.float32)
    return np.clip(out, LOG_FLOOR_EXP, 0.0, out=out)


def _coloraxis(colorscale: str, log: bool | str, zmax: float | None, title: str = "weight") -> dict:
    if log == "rank":
        return dict(
            colorscale=colorscale, cmin=0.0, cmax=1.0, colorbar=dict(title=dict(text=f"{title} rank"))
        )
    if log is True or log == "log":
        ticks = list(range(LOG_FLOOR_EXP, 1))
        return dict(
            colorscale=colorscale,
            cmin=LOG_FLOOR_EXP,
            cmax=0,
            colorbar=dict(
                title=dict(text=title), tickvals=ticks, ticktext=[f"1e{t}" if t else "1" for t in ticks]
            ),
        )
    return dict(colorscale=colorscale, cmin=0.0, cmax=zmax, colorbar=dict(title=dict(text=title)))


def _weight_hover(log: bool | str, value: str = "weight") -> str:
    """The hover's value line; ``value`` names what is drawn ("weight", "‖α·W_O v‖")."""
    if log == "rank":
        return f"{value} rank %{{z:.3f}}"
    return f"log₁₀ {value} %{{z:.2f}}" if log is True or log == "log" else f"{value} %{{z:.4f}}"


def _max(z: np.ndarray) -> float:
    m = float(np.nanmax(z)) if z.size else 1.0
    return m if m > 0 else 1.0
