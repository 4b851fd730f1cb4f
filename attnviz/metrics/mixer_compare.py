"""Two results compared head by head on their non-softmax mixers (Compare on hybrids and pure
recurrent / state-space models), by the statistics that apply to a signed, unnormalised matrix
(`attnviz.figures.mixer_stats`): distance back, self share, and negative share (signed per-head
mixers only: a per-channel mixer's one "head" is its contribution norms, never negative).
Entropy, sink share and α do not apply to these heads; softmax heads keep their own comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import AttnvizError
from ..figures.mixer_stats import STATISTICS, mixer_statistics
from ..mixers import MIXERS

SHOWN = ("distance", "self", "negative")  # of mixer_stats.STATISTICS; row_sum is not a change to rank
LABELS = {"distance": "distance back (tokens)", "self": "self share", "negative": "negative share"}
__all__ = ["SHOWN", "MixerAtlas", "MixerComparison", "compare_mixer_heads", "mixer_atlas", "mixer_heads_of"]


def mixer_heads_of(layout: Any) -> tuple[tuple[int, str], ...]:
    """(block, kind) of every non-softmax mixer of a layout, in block order."""
    return tuple((b, kind) for b, kinds in enumerate(layout.mixers) for kind in kinds if kind != "attention")


@dataclass(frozen=True)
class MixerComparison:
    """Per mixer head: each statistic of ``SHOWN`` on A and on B (float64 (heads, 3) each; NaN
    where it does not apply) and which heads they are (block, kind, head)."""

    heads: tuple[tuple[int, str, int], ...]
    a: np.ndarray
    b: np.ndarray

    @property
    def change(self) -> np.ndarray:
        """B − A, (heads, 3)."""
        return self.b - self.a

    def to_frame(self) -> Any:
        """One row per mixer head, largest change in distance back first."""
        import pandas as pd

        rows = []
        for i, (block, kind, head) in enumerate(self.heads):
            row: dict[str, Any] = {"block": block, "mixer": MIXERS[kind].display, "head": head}
            for j, name in enumerate(SHOWN):
                row[f"{LABELS[name]} A"] = self.a[i, j]
                row[f"{LABELS[name]} B"] = self.b[i, j]
            rows.append(row)
        frame = pd.DataFrame(rows)
        order = np.argsort(-np.nan_to_num(np.abs(self.change[:, 0])), kind="stable")
        return frame.iloc[order].reset_index(drop=True)


def _table(res: Any, mixers: tuple[tuple[int, str], ...]) -> np.ndarray:
    pick = [STATISTICS.index(name) for name in SHOWN]
    out = []
    for block, kind in mixers:
        stats = mixer_statistics(res, block, kind)[:, pick]
        if not MIXERS[kind].per_head:
            stats[:, SHOWN.index("negative")] = np.nan  # contribution norms: no sign
        out.append(stats)
    return np.concatenate(out) if out else np.zeros((0, len(SHOWN)))


def compare_mixer_heads(res_a: Any, res_b: Any) -> MixerComparison:
    """Every non-softmax mixer head of two results of the same mixer layout (two texts on one
    model), by distance back, self share and negative share; refuses results whose mixers
    differ (those heads cannot be paired), saying which."""
    mixers = mixer_heads_of(res_a.layout)
    if not mixers:
        raise AttnvizError(f"{res_a.model_name} has no non-softmax token mixer to compare")
    if mixer_heads_of(res_b.layout) != mixers:
        raise AttnvizError(
            f"{res_a.model_name} and {res_b.model_name} have different token mixers: their mixer heads "
            "cannot be paired one to one"
        )
    heads = tuple((b, kind, h) for b, kind in mixers for h in range(res_a.mixer_heads(b, kind)))
    if tuple((b, kind, h) for b, kind in mixers for h in range(res_b.mixer_heads(b, kind))) != heads:
        raise AttnvizError("the two results' mixers have different numbers of heads: they cannot be paired")
    return MixerComparison(heads=heads, a=_table(res_a, mixers), b=_table(res_b, mixers))


@dataclass(frozen=True)
class MixerAtlas:
    """Every non-softmax mixer head's statistics of ``SHOWN`` averaged over a corpus's texts
    (float64 (heads, 3); NaN where one does not apply), and how many texts were read."""

    heads: tuple[tuple[int, str, int], ...]
    means: np.ndarray
    n_texts: int
    skipped: int  # texts refused (too long for the limits, empty)

    def to_frame(self) -> Any:
        """One row per mixer head, longest distance back first."""
        import pandas as pd

        rows = [
            {
                "block": block,
                "mixer": MIXERS[kind].display,
                "head": head,
                **{LABELS[name]: self.means[i, j] for j, name in enumerate(SHOWN)},
            }
            for i, (block, kind, head) in enumerate(self.heads)
        ]
        order = np.argsort(-np.nan_to_num(self.means[:, 0]), kind="stable")
        return pd.DataFrame(rows).iloc[order].reset_index(drop=True)


def mixer_atlas(lm: Any, texts: list[str], *, max_tokens: int) -> MixerAtlas:
    """The mixer heads of ``lm`` (an `attnviz.LoadedModel`) over ``texts``: each text extracted
    (refused texts, e.g. longer than ``max_tokens``, are skipped and counted) and each head's
    statistics averaged over the texts read."""
    from ..extract import extract

    mixers = mixer_heads_of(lm.layout)
    if not mixers:
        raise AttnvizError(f"{lm.spec} has no non-softmax token mixer")
    total: np.ndarray | None = None
    heads: tuple[tuple[int, str, int], ...] = ()
    n = skipped = 0
    for text in texts:
        try:
            res = extract(lm, text, max_tokens=max_tokens)
        except AttnvizError:
            skipped += 1
            continue
        table = _table(res, mixers)
        if total is None:
            heads = tuple((b, kind, h) for b, kind in mixers for h in range(res.mixer_heads(b, kind)))
            total = np.zeros_like(table)
        total += table
        n += 1
    if total is None:
        raise AttnvizError(f"none of the {len(texts)} texts could be read (all {skipped} refused)")
    return MixerAtlas(heads=heads, means=total / n, n_texts=n, skipped=skipped)
