"""Patching and head-search figures: what they show, how they are labelled, what a click carries."""

from __future__ import annotations

import numpy as np
import tiny_explain as TE
from test_patching import CLEAN, CORRUPT

import attnviz
from attnviz.explain.search import search_heads


def test_patching_view_is_a_diverging_map_of_the_normalised_metric():
    lm = TE.loaded("llama-gqa")
    res = attnviz.patch(lm, CLEAN, CORRUPT, over="heads_by_position")
    fig = attnviz.patching_view(res)
    hm = fig.data[0]
    assert hm.zmid == 0 and hm.zmin == -hm.zmax and hm.zmax >= 1
    assert np.allclose(np.asarray(hm.z), res.values.reshape(-1, res.values.shape[-1]))
    assert list(hm.y[:2]) == ["L0 H0", "L0 H1"] and "(3)≠" in hm.x[3]
    assert list(hm.customdata[5][0]) == [1, 1]  # row 5: layer 1, head 1
    assert "activation patching" in fig.layout.title.text and "ESTIMATE" not in fig.layout.title.text


def test_estimate_figures_say_estimate_and_show_the_real_patches_beside_it():
    lm = TE.loaded("llama-gqa")
    est = attnviz.attribution_patch(lm, CLEAN, CORRUPT, over="residual", verify=4)
    fig = attnviz.patching_view(est)
    assert "ESTIMATE" in fig.layout.title.text and fig.data[0].colorbar.title.text == "estimate"
    cmp = attnviz.patching_comparison_view(est)
    assert len(cmp.data) == 3 and "ESTIMATE" in cmp.layout.annotations[0].text
    real = np.asarray(cmp.data[1].z, dtype=float)
    assert np.isfinite(real).sum() == 4
    for idx, (e, r) in est.verified.items():
        assert real[idx] == r and np.asarray(cmp.data[2].z, dtype=float)[idx] == e - r


def test_head_search_view_ranks_on_a_probability_scale():
    lm = TE.loaded("llama-gqa")
    found = search_heads(attnviz.extract(lm, CLEAN), -1, 3)
    fig = attnviz.head_search_view(found)
    assert fig.data[0].zmin == 0 and np.allclose(np.asarray(fig.data[0].z), found.scores)
    assert "query 8" in fig.layout.title.text
