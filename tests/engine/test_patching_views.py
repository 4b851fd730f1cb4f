"""Patching and head-search figures: what they show, how they are labelled, what a click carries."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest
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
    assert list(hm.customdata[6][0]) == [1, 2]  # row 6: layer 1, head 2
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


@pytest.mark.parametrize("direction", ["denoise", "noise"])
@pytest.mark.parametrize("over", ["heads", "heads_by_position", "residual", "blocks"])
def test_every_cell_carries_its_own_layer_head_value_and_token(over, direction):
    """Each cell's row label, click data ([layer, head]) and value are the same (layer, head /
    part) of the result, and each column names the patched run's token at its position (the
    corrupted prompt when denoising, the clean one when noising). Caught: click data written
    [head, layer] (a symmetric cell passed the old spot check); the other prompt's tokens."""
    lm = TE.loaded("llama-gqa")
    res = attnviz.patch(lm, CLEAN, CORRUPT, over=over, direction=direction)
    hm = attnviz.patching_view(res).data[0]
    z = np.asarray(hm.z)
    patched = attnviz.tokenize(lm, CORRUPT if direction == "denoise" else CLEAN)[0]
    shown = attnviz.Tokens.build(lm.tokenizer, patched).display
    for r, label in enumerate(hm.y):
        m = re.fullmatch(r"L(\d+)(?: H(\d+)| (attn|mlp))?", label)
        assert m, label
        layer = int(m[1])
        head = int(m[2]) if m[2] else -1
        part = ("attn", "mlp").index(m[3]) if m[3] else None
        for c in range(z.shape[1]):
            if res.dims == ("layer", "head"):  # columns are the heads
                assert list(hm.customdata[r][c]) == [layer, c] and hm.x[c] == f"H{c}"
                want = res.values[layer, c]
            else:
                assert list(hm.customdata[r][c]) == [layer, head]
                inner = (head,) if head >= 0 else (part,) if part is not None else ()
                want = res.values[(layer, *inner, c)]
                p = res.pairing.target[c]
                assert hm.x[c].startswith(f"({p})") and shown[p][:8] in html.unescape(hm.x[c])
            assert z[r, c] == want
    if res.dims != ("layer", "head"):  # position 3 is where the prompts differ
        assert ("fox" if direction == "denoise" else "bank") in hm.x[3]


def test_head_search_cells_carry_their_own_layer_and_head():
    lm = TE.loaded("llama-gqa")
    found = search_heads(attnviz.extract(lm, CLEAN), -1, 3)
    hm = attnviz.head_search_view(found).data[0]
    for la, row in enumerate(hm.customdata):
        assert hm.y[la] == f"L{la}"
        for h, cell in enumerate(row):
            assert list(cell) == [la, h] and hm.x[h] == f"H{h}" and hm.z[la][h] == found.scores[la, h]
