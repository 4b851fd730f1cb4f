"""A self-check's figures (`Check`) and their one-line caption: what a result says it was proven
equal to. Its own module so that every engine part that checks (the exact paths, the mixers) can
make one without importing the result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """The self-check: one layer recomputed by transformers' own eager attention on the same input."""

    stack: str
    layer: int
    max_abs_diff: float
    dtype: str  # e.g. "float32"
    tolerance: float
    against: str = "transformers' eager attention on the same layer input"
    mixer: str = "attention"  # a non-softmax mixer's check: ``layer`` is then the model's block
    scale: float | None = None  # max |output| a mixer's check compared against (its Δ is absolute)

    def caption(self) -> str:
        """e.g. "checked against eager: max |Δ| 3e-08, float32 (self layer 1)"."""
        if self.against == "eager itself":
            return f"eager's own probabilities (one layer at a time), {self.dtype}"
        if self.mixer != "attention":
            return (
                f"{self.mixer} block {self.layer} checked against {self.against}: max |Δ| "
                f"{self.max_abs_diff:.0e} at output scale {self.scale or 0:.0e}, {self.dtype}"
            )
        where = f"{self.stack} layer {self.layer}"
        return f"checked against eager: max |Δ| {self.max_abs_diff:.0e}, {self.dtype} ({where})"


def checks_caption(checks: Sequence[Check]) -> str:
    """One line for the self-check of every stack: one stack reads as `Check.caption`; several as
    "checked against eager, float32: max |Δ| 2e-08 (encoder layer 1), 3e-08 (decoder layer 1),
    2e-08 (cross layer 1)"; "" when none ran."""
    if not checks:
        return ""
    mixers = [c for c in checks if c.mixer != "attention"]
    if mixers:
        rest = checks_caption([c for c in checks if c.mixer == "attention"])
        return "; ".join([*([rest] if rest else []), *(c.caption() for c in mixers)])
    if len(checks) == 1 or all(c.against == "eager itself" for c in checks):
        return checks[0].caption()
    dtypes = ", ".join(dict.fromkeys(c.dtype for c in checks))
    figures = ", ".join(f"{c.max_abs_diff:.0e} ({c.stack} layer {c.layer})" for c in checks)
    return f"checked against eager, {dtypes}: max |Δ| {figures}"
