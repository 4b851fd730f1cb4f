"""The atlas of one model over a corpus: per-text head statistics, and every head ranked by each.

    atlas.ranking("previous_token")[:5]     # [(layer, head, mean over texts), ...]
    atlas.example("previous_token", 3, 0)   # the text where head (3, 0) scores highest + its link
    atlas.to_frame().to_csv("atlas.csv")    # one row per head (the table the atlas page shows)
    atlas.texts_frame()                     # one row per text x head

Per text the statistics are `attnviz.metrics.head_metrics` of that text (the same numbers the
overview page shows for it); the atlas keeps them all, (texts, layers, heads) per statistic, so
means, maxima and the example text are exact reductions of per-text values. For each head and
text it also keeps the strongest link: the (query, key) pair with the largest weight outside
row 0 (whose only key is forced) and key 0 (the sink most heads fall back on), which makes the
example snippet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import AttnvizError
from ..layout import Stack

STATISTICS: tuple[str, ...] = ("entropy", "sink", "previous_token", "diagonal", "distance")


@dataclass(frozen=True)
class Example:
    """A head's example for one statistic: the text where it scores highest and its strongest link."""

    text_index: int
    value: float
    query: int
    key: int
    weight: float
    snippet: str  # plain text (escape before showing as HTML)


@dataclass(frozen=True, eq=False)
class Atlas:
    """Per-text head statistics of one model over a corpus (see the module doc).

    ``computed`` texts ran in this call, ``reused`` came from the disk cache (a resumed run
    computes only what is missing); ``skipped`` lists the texts that failed, with the reason.
    """

    model_name: str
    stack: Stack
    texts: tuple[str, ...]  # the texts that ran, in corpus order
    tokens: tuple[tuple[str, ...], ...]  # display tokens per text
    values: dict[str, np.ndarray]  # statistic -> float64 (texts, layers, heads)
    links: np.ndarray  # float64 (texts, layers, heads, 3): query, key, weight of the strongest link
    skipped: tuple[tuple[int, str], ...] = ()  # (index in the corpus, reason)
    cancelled: bool = False
    seconds: float = 0.0
    from_cache: bool = False  # nothing was computed: every text came from the disk cache
    layer_labels: tuple[str, ...] = field(default=())
    indices: tuple[int, ...] = ()  # each kept text's index in the corpus
    keys: tuple[str, ...] = ()  # each kept text's stable key (attnviz.atlas.corpus.text_key)
    computed: int = 0  # texts computed by this call
    reused: int = 0  # texts read from the disk cache
    engine: str = "local"
    workers: int = 1
    cache_error: str = ""  # why results could not be saved on disk ("" when they were)

    @property
    def n_texts(self) -> int:
        return len(self.texts)

    @property
    def shape(self) -> tuple[int, int]:
        """(layers, heads)."""
        any_values = next(iter(self.values.values()))
        return int(any_values.shape[1]), int(any_values.shape[2])

    def _values(self, statistic: str) -> np.ndarray:
        if statistic not in self.values:
            raise AttnvizError(f"unknown statistic {statistic!r}; use one of {tuple(self.values)}")
        if self.n_texts == 0:
            raise AttnvizError("the atlas has no texts yet")
        return self.values[statistic]

    def mean(self, statistic: str) -> np.ndarray:
        """Mean over texts: float64 (layers, heads)."""
        return self._values(statistic).mean(axis=0)

    def ranking(self, statistic: str, k: int | None = None) -> list[tuple[int, int, float]]:
        """Heads by mean over texts, highest first: (layer, head, mean)."""
        m = self.mean(statistic)
        order = np.argsort(-m, axis=None, kind="stable")[:k]
        return [(int(i) // m.shape[1], int(i) % m.shape[1], float(m.flat[i])) for i in order]

    def example(self, statistic: str, layer: int, head: int, context: int = 4) -> Example:
        """The text where head (layer, head) scores highest on ``statistic``, with its link."""
        v = self._values(statistic)[:, layer, head]
        t = int(np.argmax(v))
        q, k, w = self.links[t, layer, head]
        return Example(
            t, float(v[t]), int(q), int(k), float(w), snippet(self.tokens[t], int(q), int(k), context)
        )

    def to_rows(self) -> list[dict[str, Any]]:
        """One row per head: layer, head, then each statistic's mean, max and example snippet."""
        n_l, n_h = self.shape
        rows = []
        for layer in range(n_l):
            for head in range(n_h):
                row: dict[str, Any] = {"layer": layer, "head": head}
                for s in self.values:
                    ex = self.example(s, layer, head)
                    row[f"{s}_mean"] = float(self.values[s][:, layer, head].mean())
                    row[f"{s}_max"] = ex.value
                    row[f"{s}_example"] = ex.snippet
                rows.append(row)
        return rows

    def to_frame(self):
        """A pandas DataFrame of `to_rows` (``.to_csv`` / ``.to_parquet`` export it)."""
        import pandas as pd

        return pd.DataFrame(self.to_rows())

    def texts_frame(self):
        """One row per text x head: the text's corpus index and key, layer, head, every statistic,
        and the strongest link (query, key, weight)."""
        import pandas as pd

        n_t = self.n_texts
        n_l, n_h = self.shape if n_t else (0, 0)
        grid = (n_t, n_l, n_h)
        cols: dict[str, Any] = {
            "text_index": np.broadcast_to(np.asarray(self.indices, dtype=np.int64)[:, None, None], grid),
            "key": np.broadcast_to(np.asarray(self.keys, dtype=object)[:, None, None], grid),
            "layer": np.broadcast_to(np.arange(n_l)[None, :, None], grid),
            "head": np.broadcast_to(np.arange(n_h)[None, None, :], grid),
        }
        for s in self.values:
            cols[s] = self.values[s]
        for i, name in enumerate(("link_query", "link_key")):
            cols[name] = self.links[..., i].astype(np.int64)
        cols["link_weight"] = self.links[..., 2]
        return pd.DataFrame({k: np.asarray(v).reshape(-1) for k, v in cols.items()})


def snippet(tokens: Sequence[str], query: int, key: int, context: int = 4) -> str:
    """Plain text around a link: ``…before [key] after … before [query] …`` (one window if close)."""

    def window(a: int, b: int) -> str:
        lo, hi = max(0, a - context), min(len(tokens), b + context + 1)
        parts = [f"[{tokens[i]}]" if i in (query, key) else tokens[i] for i in range(lo, hi)]
        return ("… " if lo > 0 else "") + " ".join(parts) + (" …" if hi < len(tokens) else "")

    a, b = min(query, key), max(query, key)
    if b - a <= 2 * context + 1:
        return window(a, b)
    return f"{window(a, a)} ⇢ {window(b, b)}"
