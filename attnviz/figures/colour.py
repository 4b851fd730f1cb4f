"""Colour scales and the shared colour axis (linear or log10 weights)."""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

ColorScale = Literal["Viridis", "Magma", "Inferno", "Cividis", "Blues", "Greys"]
COLORSCALES: tuple[str, ...] = get_args(ColorScale)
DIVERGING = "RdBu_r"
LOG_FLOOR_EXP = -5  # log colour: weights below 1e-5 share the lowest colour


def _colour(z: np.ndarray, log: bool) -> np.ndarray:
    if not log:
        return z
    out = np.log10(np.maximum(z, 10.0**LOG_FLOOR_EXP)).astype(np.float32)
    return np.clip(out, LOG_FLOOR_EXP, 0.0, out=out)


def _coloraxis(colorscale: str, log: bool, zmax: float | None, title: str = "weight") -> dict:
    if log:
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


def _weight_hover(log: bool) -> str:
    return "log₁₀ weight %{z:.2f}" if log else "weight %{z:.4f}"


def _max(z: np.ndarray) -> float:
    m = float(np.nanmax(z)) if z.size else 1.0
    return m if m > 0 else 1.0
