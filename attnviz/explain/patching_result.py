"""The result of activation / attribution patching (`attnviz.patch`): the grid of normalised and
raw logit differences with its coordinates, rankings and tables. Split from `patching`, which
runs the grid; `normalised` is the metric's one scale, used by both."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..tokens import Tokens
from .patch_sites import PARTS, Direction, Over, Pairing

EXACT = "activation patching: one forward per cell, the model's own computation"
ESTIMATE = "attribution patching: a first-order ESTIMATE (two forwards, one backward)"


@dataclass(frozen=True)
class Patching:
    """Patching results on a grid: ``values`` (normalised: 0 = corrupted, 1 = clean) and ``raw``
    (the patched run's logit difference), both shaped by ``dims`` (e.g. ("layer", "head")).
    ``estimate`` is True for attribution patching (a first-order estimate, not a patched run)."""

    model_name: str
    clean: Tokens
    corrupted: Tokens
    over: Over
    direction: Direction
    answer: int
    answer_token: str
    wrong: int
    wrong_token: str
    clean_diff: float  # logit(answer) − logit(wrong) at the clean prompt's last position
    corrupted_diff: float
    dims: tuple[str, ...]
    values: np.ndarray  # float64
    raw: np.ndarray  # float64
    pairing: Pairing
    estimate: bool = False
    method: str = EXACT
    # attribution patching: the top cells patched for real, {cell index: (estimate, real)} normalised
    verified: dict[tuple[int, ...], tuple[float, float]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # the "part" axis of over="blocks": ("attention", "mlp"), or a hybrid's mixers and its MLP
    # (a cell of a part its block does not have is NaN)
    parts: tuple[str, ...] = PARTS

    @property
    def nbytes(self) -> int:
        """Bytes the result holds (its two grids; for caches)."""
        return int(self.values.nbytes + self.raw.nbytes) + 64 * (len(self.clean) + len(self.corrupted))

    @property
    def positions(self) -> tuple[int, ...]:
        """The patched run's positions along a "position" axis (the aligned ones, in order)."""
        return self.pairing.target

    @property
    def label(self) -> str:
        return "estimate" if self.estimate else "patched"

    def normalise(self, diff: float | np.ndarray) -> Any:
        """A raw logit difference on this result's scale (0 = corrupted run, 1 = clean run)."""
        return normalised(diff, self.clean_diff, self.corrupted_diff)

    def cell(self, index: tuple[int, ...]) -> dict[str, Any]:
        """The cell at ``index`` as {dim: label}: layer and head as numbers, the position as the
        patched run's position, the block part by name."""
        out: dict[str, Any] = {}
        for dim, i in zip(self.dims, index, strict=True):
            if dim == "position":
                out["position"] = self.pairing.target[i]
                out["source_position"] = self.pairing.source[i]
            elif dim == "part":
                out["part"] = self.parts[i]
            else:
                out[dim] = int(i)
        return out

    def to_frame(self) -> Any:
        """One row per cell: its coordinates, ``value`` (normalised), ``logit_diff`` (raw), and
        for attribution patching ``estimate`` = True (and the verified cells' real values)."""
        import pandas as pd

        rows = []
        for index in np.ndindex(*self.values.shape):
            row = self.cell(index)
            row["value"] = float(self.values[index])
            row["logit_diff"] = float(self.raw[index])
            row["estimate"] = self.estimate
            if self.estimate:
                row["real"] = self.verified[index][1] if index in self.verified else np.nan
            rows.append(row)
        return pd.DataFrame(rows)

    def ranking(self, top: int | None = None) -> list[tuple[tuple[int, ...], float]]:
        """(cell index, value) by |value − baseline| largest first: the cells that move the metric
        most (baseline 0 for denoising, 1 for noising)."""
        base = 0.0 if self.direction == "denoise" else 1.0
        flat = [(idx, float(self.values[idx])) for idx in np.ndindex(*self.values.shape)]
        flat = [c for c in flat if not np.isnan(c[1])]  # a part its block does not have
        flat.sort(key=lambda c: -abs(c[1] - base))
        return flat if top is None else flat[:top]

    def comparison(self) -> Any:
        """The verified cells: estimate, real patch and their difference (attribution patching)."""
        import pandas as pd

        rows = [
            {**self.cell(idx), "estimate": est, "real": real, "difference": est - real}
            for idx, (est, real) in self.verified.items()
        ]
        return pd.DataFrame(rows)


def normalised(diff: Any, clean_diff: float, corrupted_diff: float) -> Any:
    """The metric's one scale: (diff − corrupted) / (clean − corrupted), 0 = corrupted, 1 = clean."""
    return (diff - corrupted_diff) / (clean_diff - corrupted_diff)
