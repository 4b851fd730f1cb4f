"""GQA's one rule (`attnviz.layout`): KV head g serves query heads g·group .. (g+1)·group − 1.

Each helper is checked against a hand-written loop over the heads, and the metrics' group
coherence against the same loop on heads where the interleaved grouping (query head h reading KV
head h % n_kv, what a from-scratch implementation easily writes) gives a different answer.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnviz.layout import AttentionLayout, by_kv_group, kv_heads_of, query_group, repeat_kv
from attnviz.metrics.definitions import _coherence_sums, group_coherence


def owners(n_kv: int, group: int) -> list[int]:
    """The KV head of each query head, by the loop over KV heads and their groups."""
    owner = {}
    for g in range(n_kv):
        for j in range(group):
            owner[g * group + j] = g
    return [owner[h] for h in range(n_kv * group)]


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("n_kv", [1, 3])
def test_layout_helpers_follow_the_loop_over_heads(group, n_kv):
    n_heads, owner = n_kv * group, owners(n_kv, group)
    assert query_group(n_heads, n_kv) == group
    assert kv_heads_of(range(n_heads), n_heads, n_kv) == owner
    lay = AttentionLayout("llama", "decoder", 1, n_heads, n_kv, 4, 4 * n_heads)
    assert lay.group_size == group and [lay.kv_head_of(h) for h in range(n_heads)] == owner

    kv = torch.randn(2, n_kv, 5, 3)  # (batch, kv_head, pos, d)
    rep = repeat_kv(kv, group)  # (batch, head, pos, d)
    assert rep.shape == (2, n_heads, 5, 3)
    for h in range(n_heads):
        assert torch.equal(rep[:, h], kv[:, owner[h]])
    assert torch.equal(repeat_kv(kv[0], group, dim=0), rep[0])

    heads = torch.randn(2, n_heads, 5, 3)
    for dim in (1, -3):
        split = by_kv_group(heads, group, dim)  # (batch, kv_head, group, pos, d)
        assert split.shape == (2, n_kv, group, 5, 3)
        assert split.data_ptr() == heads.data_ptr()  # a view
        for h in range(n_heads):
            assert torch.equal(split[:, owner[h], h - owner[h] * group], heads[:, h])
        assert torch.equal(split.flatten(1, 2), heads)
    again = by_kv_group(rep, group, 1)  # each KV head repeated for its group, in place
    for g in range(n_kv):
        for j in range(group):
            assert torch.equal(again[:, g, j], kv[:, g])


def _similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """exp(-(KL(a||b) + KL(b||a)) / 2) per row of two (rows, keys) patterns with no zeros."""
    kl_ab, kl_ba = (a * np.log(a / b)).sum(-1), (b * np.log(b / a)).sum(-1)
    return np.exp(-(kl_ab + kl_ba) / 2)


def _coherence_by_hand(probs: np.ndarray, group_of: list[int], n_kv: int) -> np.ndarray:
    """Mean over rows and head pairs of the similarity within each KV head's set of query heads."""
    out = np.zeros(n_kv)
    for g in range(n_kv):
        mine = [h for h, o in enumerate(group_of) if o == g]
        pairs = [(a, b) for i, a in enumerate(mine) for b in mine[i + 1 :]]
        out[g] = np.mean([_similarity(probs[a], probs[b]).mean() for a, b in pairs])
    return out


@pytest.mark.parametrize("group", [2, 4])
def test_coherence_groups_heads_by_the_layout_rule_not_interleaved(group):
    """Caught (planted in `_coherence_sums`): query heads grouped h % n_kv instead of h // group."""
    n_kv, rows, keys = 2, 3, 5
    rng = np.random.default_rng(group)
    probs = rng.dirichlet(np.ones(keys), size=(n_kv * group, rows))  # (heads, rows, keys), bidirectional
    probs[:group] = probs[0]  # KV head 0's query heads attend alike: coherence 1 under the rule
    right = _coherence_by_hand(probs, owners(n_kv, group), n_kv)
    interleaved = _coherence_by_hand(probs, [h % n_kv for h in range(n_kv * group)], n_kv)
    assert right[0] == pytest.approx(1.0) and not np.allclose(right, interleaved, atol=1e-3)

    assert group_coherence(probs, group, causal=False) == pytest.approx(right, abs=1e-6)
    t = torch.from_numpy(probs)[None].expand(2, -1, -1, -1)  # a leading (layer,) dim
    total, n = _coherence_sums(t, torch.ones(rows, dtype=torch.bool), group)  # (layer, kv_head), (..)
    pairs = group * (group - 1) // 2
    assert float(n) == rows * pairs
    assert (total / n).numpy() == pytest.approx(np.stack([right, right]), abs=1e-9)
