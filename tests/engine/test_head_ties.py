"""Every per-head number outside the atlas tied to its (layer, head): the overview's head table
and top list (`HeadMetrics`), and the Explain attribution's ranking. Each is read back on values
that differ everywhere, with layers and heads of different counts, so a swapped or shifted
index names another head (the atlas has its own: test_atlas_ties.py)."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.explain.attribution import Attribution
from attnviz.metrics.heads import HeadMetrics

L, H = 3, 4


def grid(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(L * H).reshape(L, H) / 10.0


def test_head_metrics_rows_and_top_name_their_heads():
    """Caught (test_metrics too): top's flat index split by layers; a row's kv_head as h % group."""
    values = {m: grid(i) for i, m in enumerate(("entropy", "sink", "previous_token", "diagonal", "distance"))}
    hm = HeadMetrics(stack="self", n_tokens=9, group_size=2, **values)
    for layer, head, v in hm.top("sink", L * H):
        assert v == values["sink"][layer, head], (layer, head)
    assert [t[:2] for t in hm.top("sink", 3)] == [
        tuple(int(x) for x in np.unravel_index(i, (L, H))) for i in np.argsort(-values["sink"], axis=None)[:3]
    ]
    for row in hm.to_rows():
        assert row["kv_head"] == row["head"] // 2
        for m, v in values.items():
            assert row[m] == v[row["layer"], row["head"]], (m, row)


def test_attribution_ranking_names_its_heads():
    """Caught (no other test did): each head's value read at the transposed flat index."""
    heads = grid(9) - 0.55
    att = Attribution(
        model_name="m",
        tokens=None,  # type: ignore[arg-type]
        position=0,
        target=1,
        target_token="a",
        contrast=None,
        contrast_token="",
        logit=0.0,
        embedding=0.01,
        heads=heads,
        mlps=np.array([0.002, -0.003, 0.004]),
        rest=0.0,
        error=0.0,
    )
    ranked = att.ranking()
    assert len(ranked) == 1 + L + L * H
    for kind, layer, head, v in ranked:
        if kind == "head":
            assert v == pytest.approx(heads[layer, head]), (layer, head)
        elif kind == "mlp":
            assert v == pytest.approx(att.mlps[layer]) and head == -1
    assert [abs(p[3]) for p in ranked] == sorted((abs(p[3]) for p in ranked), reverse=True)
