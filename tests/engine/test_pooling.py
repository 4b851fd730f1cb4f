"""Pooled views and zoom regions equal pooling / slicing the dense probabilities."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tiny
from sharp_models import TEXT, sharp

import attnviz
from attnviz.analysis import pooling as P
from attnviz.errors import AttnvizError, OutOfMemory


def _pool(dense: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and max over block × block cells of (h, q, k) by plain loops (the oracle)."""
    h, n_q, n_k = dense.shape
    gq, gk = math.ceil(n_q / block), math.ceil(n_k / block)
    mean, mx = np.zeros((h, gq, gk)), np.zeros((h, gq, gk))
    for a in range(gq):
        for b in range(gk):
            cell = dense[:, a * block : (a + 1) * block, b * block : (b + 1) * block]
            mean[:, a, b] = cell.mean((1, 2))
            mx[:, a, b] = cell.max((1, 2))
    return mean, mx


def _pool_edges(dense: np.ndarray, row_edges, col_edges, how: str) -> np.ndarray:
    """Max or mean over the bins that start at the given edges, by plain loops (the oracle of
    pooling on given bins; figures.pool is checked against it, never used as one)."""
    rows = [*map(int, row_edges), dense.shape[-2]]
    cols = [*map(int, col_edges), dense.shape[-1]]
    out = np.zeros((*dense.shape[:-2], len(rows) - 1, len(cols) - 1))
    for a in range(len(rows) - 1):
        for b in range(len(cols) - 1):
            cell = dense[..., rows[a] : rows[a + 1], cols[b] : cols[b + 1]]
            out[..., a, b] = cell.max((-2, -1)) if how == "max" else cell.mean((-2, -1))
    return out


@pytest.mark.parametrize("arch", tiny.ARCHS)
@pytest.mark.parametrize("cells", [7, 16, 1000])
def test_pooled_equals_dense_pooling(arch, cells, monkeypatch):
    monkeypatch.setattr(P, "TILE_ELEMENTS", 4 * 12 * 12)  # many tiles, ragged edges
    res = attnviz.extract(sharp(arch), TEXT)
    for stack in res.stacks:
        layer = res.n_layers(stack) - 1
        view = P.pooled(res, layer, cells=cells, stack=stack)
        dense = res.layer(layer, stack=stack)
        mean, mx = _pool(dense, view.block)
        assert view.mean.shape == mean.shape and view.block == math.ceil(max(dense.shape[1:]) / cells)
        tol = 1e-4 if arch == "t5" else 1e-5  # T5's unscaled scores: row chunks round differently
        assert np.abs(view.mean - mean).max() < tol
        assert np.abs(view.max - mx).max() < tol
        one = P.pooled(res, layer, [2], cells=cells, stack=stack)
        assert np.abs(one.mean[0] - mean[2]).max() < 1e-4  # T5: unscaled scores and one.heads == (2,)
        expected = {"gemma2": "dense: soft-capping", "t5": "dense: position bias"}.get(arch, "fused")
        assert view.path == expected


def test_region_equals_the_dense_slice():
    res = attnviz.extract(sharp("mistral-sliding"), TEXT)
    dense = res.layer(1)
    got = P.region(res, 1, [0, 3], rows=slice(10, 30), cols=slice(5, 25))
    assert got.shape == (2, 20, 20)
    assert np.abs(got - dense[[0, 3], 10:30, 5:25]).max() < 1e-5
    res_g = attnviz.extract(sharp("gemma2"), TEXT)
    got = P.region(res_g, 0, None, rows=slice(3, 9), cols=slice(0, 4))
    assert np.abs(got - res_g.layer(0)[:, 3:9, 0:4]).max() < 1e-7
    with pytest.raises(AttnvizError):
        P.region(res, 0, rows=slice(5, 5), cols=slice(0, 3))
    with pytest.raises(AttnvizError):
        P.pooled(res, 0, [9])


def test_a_view_too_big_for_memory_is_a_message(monkeypatch):
    import attnviz.limits as L

    res = attnviz.extract(sharp("gpt2"), TEXT)
    monkeypatch.setattr(L, "free_bytes", lambda device: 1000)
    with pytest.raises(
        OutOfMemory, match=r"a pooled view needs .* GiB, 0.00 GiB free on cpu — try fewer cells"
    ):
        P.pooled(res, 0)


def test_pooled_on_given_bins_equals_pooling_by_loops():
    """The app's own bins (attnviz.figures.bin_edges, near-equal), pooled on the device, equal the
    loops; so does the figures' host pooling of the same bins. (This test once used figures.pool
    as its oracle. Caught: one wrong mean (divided by the key bins' widths alone) planted in both
    the device pooling and figures.pool, which the old test passed.)"""
    from attnviz import figures as F

    res = attnviz.extract(sharp("llama-gqa"), TEXT)
    dense = res.layer(2)
    re, ce = F.bin_edges(dense.shape[1], 10), F.bin_edges(dense.shape[2], 13)
    view = P.pooled(res, 2, row_edges=re, col_edges=ce)
    assert view.path == "fused" and view.max.shape == (4, 10, 13)
    for how in ("max", "mean"):
        want = _pool_edges(dense, re, ce, how)
        np.testing.assert_allclose(view.values(how), want, atol=1e-5)
        np.testing.assert_allclose(F.pool(dense, re, ce, how), want, atol=1e-6)
    with pytest.raises(AttnvizError):
        P.pooled(res, 2, row_edges=[1, 5])


@pytest.mark.parametrize("arch", ["llama-gqa", "mistral-sliding", "bert"])
@pytest.mark.parametrize("side", [5, 8, 13])
def test_equal_bins_pool_by_reshapes_and_match_dense_pooling(arch, side, monkeypatch):
    """Bins of one width (`equal_edges`, ragged last bin) take the reshape path (row chunks of
    whole bins, causal keys cut, max = exp(max(s - L))) and equal dense pooling; each pool alone
    equals the same pool of both."""
    monkeypatch.setattr(P, "CHUNK_ROWS", 7)  # many chunks, each of whole bins
    ran = []
    real = P._reshaped
    monkeypatch.setattr(P, "_reshaped", lambda *a, **k: ran.append(1) or real(*a, **k))
    res = attnviz.extract(sharp(arch), TEXT)
    layer = res.n_layers() - 1
    dense = res.layer(layer)
    re, ce = P.equal_edges(dense.shape[1], side), P.equal_edges(dense.shape[2], side + 2)
    assert len(re) <= side and (np.diff(re) == re[1]).all() and dense.shape[1] - re[-1] <= re[1]
    both = P.pooled(res, layer, row_edges=re, col_edges=ce)
    assert ran and both.path == "fused"
    np.testing.assert_allclose(both.values("max"), _pool_edges(dense, re, ce, "max"), rtol=0, atol=1e-6)
    np.testing.assert_allclose(both.values("mean"), _pool_edges(dense, re, ce, "mean"), rtol=0, atol=1e-6)
    for how in P.POOLS:
        one = P.pooled(res, layer, [1, 3], row_edges=re, col_edges=ce, pools=[how])
        np.testing.assert_allclose(one.values(how), both.values(how)[[1, 3]], rtol=0, atol=1e-7)
        other = "mean" if how == "max" else "max"
        with pytest.raises(AttnvizError, match=f"no '{other}' pool"):
            one.values(other)
    with pytest.raises(AttnvizError, match="pools must name"):
        P.pooled(res, layer, pools=["median"])
