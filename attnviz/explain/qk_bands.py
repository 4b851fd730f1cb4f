"""One QK term split by rotary band: T[a, b] = Σ_m T_m[a, b], each band m a pair of the head's dims.

RoPE turns each pair of dims (the model's own pairing: "half", dims m and m + rot/2; or
"interleaved", 2m and 2m + 1) by its own angle, so after the turn the score still adds up over
dims, and grouping the dims by pair gives

    T_m[a, b] = scaling · Σ_{d ∈ pair m} q_a(i)[d] · k_b(j)[d]

with one more band for the dims left unrotated (partial rotary) — or, without rotary tables
(ALiBi, NoPE, learned positions), one band holding every dim. The bands partition the dims, so
each term's bands sum to it exactly (float64). Bands are numbered as `attnviz.explain.rotary`
numbers them (band 0: the fastest turn, the shortest wavelength).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import AttnvizError
from .qk_maps import SideMap
from .rotary import spec_from_tables

NO_ROTATION = "no rotation"


@dataclass(frozen=True)
class BandSplit:
    """Each part's image on both sides, and which band each dim of the head belongs to."""

    labels: tuple[str, ...]  # one per band ("band 0 (λ 6.3 tok)", ..., "no rotation")
    band_of_dim: np.ndarray  # (d_head,) int: index into ``labels``
    query_images: np.ndarray  # (parts, d_head) float64 q_a(i) after the turn
    key_images: np.ndarray  # (parts, d_head) float64 k_b(j) after the turn
    scaling: float

    def terms(self, pairs: list[tuple[int, int]]) -> np.ndarray:
        """(bands, len(pairs)): T_m[a, b] for each (a, b); column sums are T[a, b]."""
        out = np.zeros((len(self.labels), len(pairs)))
        for col, (a, b) in enumerate(pairs):
            prod = self.scaling * self.query_images[a] * self.key_images[b]  # (d_head,)
            np.add.at(out[:, col], self.band_of_dim, prod)
        return out


def dim_bands(side: SideMap, d_head: int) -> tuple[tuple[str, ...], np.ndarray]:
    """(labels, band of each dim) from the side's rotary tables and pairing."""
    if side.cos is None or side.sin is None:
        return (NO_ROTATION,), np.zeros(d_head, dtype=int)
    rot = int(side.cos.shape[-1])
    half = rot // 2
    dims = np.arange(d_head)
    band = np.full(d_head, half, dtype=int)  # the unrotated dims: the last band
    if side.pairing == "half":
        band[:rot] = dims[:rot] % half
    else:
        band[:rot] = dims[:rot] // 2
    wavelengths: list[float] = []
    if side.cos.shape[0] >= 2:
        with contextlib.suppress(AttnvizError):
            theta = spec_from_tables(side.cos, side.sin, d_head).theta
            wavelengths = [2 * math.pi / max(t, 1e-30) for t in theta]
    labels = [
        f"band {m}" + (f" (λ {wavelengths[m]:.3g} tok)" if m < len(wavelengths) else "") for m in range(half)
    ]
    if rot < d_head:
        labels.append(NO_ROTATION)
    return tuple(labels), band


def band_split(qmap: SideMap, q_img: torch.Tensor, k_img: torch.Tensor, scaling: float) -> BandSplit:
    """The band split of one cell's terms from its parts' images (parts, d_head) on each side."""
    labels, band = dim_bands(qmap, int(q_img.shape[-1]))
    return BandSplit(
        labels=labels,
        band_of_dim=band,
        query_images=q_img.double().numpy(),
        key_images=k_img.double().numpy(),
        scaling=float(scaling),
    )
