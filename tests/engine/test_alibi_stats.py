"""ALiBi's key-only bias stays on the fused statistics path, exactly.

BLOOM, MPT and Falcon-ALiBi (tiny random models of tests/engine/adapter_models.py) record a per-head bias
of shape (1, heads, 1, key_pos): s_ij = scale · q_i·k_j + b_hj + mask. `lse.layer_spec` accepts it,
the fused kernels see it as extra feature columns, and every statistic, the induction score,
token rollout, pooled views and zoomed regions equal the dense definitions (1e-4, float32).
A query-dependent bias (T5, (1, heads, N, N)) still goes to the dense path.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from adapter_models import build, ids, wrap

import attnviz
from attnviz import metrics as M
from attnviz.analysis import rollout as R
from attnviz.analysis.pooling import pooled, region
from attnviz.exact import lse

ALIBI = ["bloom", "mpt", "falcon-alibi"]
N = 120
_RESULTS: dict[str, attnviz.AttentionResult] = {}


def result(variant: str) -> attnviz.AttentionResult:
    if variant not in _RESULTS:
        lm = wrap(build(variant)[0])
        assert lm.fast_exact, lm.probe and lm.probe.why_not_fast
        _RESULTS[variant] = attnviz.extract_ids(lm, ids(N))
    return _RESULTS[variant]


@pytest.mark.parametrize("variant", ALIBI)
def test_alibi_statistics_fused_equal_dense(variant):
    res = result(variant)
    cap = lse.captured(res, "self", 0)
    assert cap.position_bias is not None and tuple(cap.position_bias.shape) == (1, res.n_heads, 1, N)
    assert lse.key_bias(cap) is not None and float(lse.key_bias(cap).abs().max()) > 1.0  # a real bias
    fast = M.head_metrics(res)
    dense = M.head_metrics(res, computation="dense")
    assert fast.paths == ("fused",) * res.n_layers(), fast.paths
    assert all(p == "dense: asked" for p in dense.paths)
    errs = {}
    for m in fast.metrics:
        a, b = fast.values(m), dense.values(m)
        assert a.shape == b.shape and np.isfinite(a).all(), m
        errs[m] = float(np.abs(a - b).max())
        assert errs[m] <= 1e-4 * (N if m == "distance" else 1), (variant, m, errs[m])
    print(variant, "head_metrics max|d|", errs)


@pytest.mark.parametrize("variant", ALIBI)
@pytest.mark.parametrize("sink_aware", [False, True])
def test_alibi_token_rollout_fused_equals_dense(variant, sink_aware):
    res = result(variant)
    for token in (-1, 57):
        fast = R.token_rollout(res, token, sink_aware=sink_aware)
        dense = R.token_rollout(res, token, sink_aware=sink_aware, computation="dense")
        assert fast.paths == ("fused",) * res.n_layers(), fast.paths
        err = float(np.abs(fast.sources - dense.sources).max())
        assert err <= 1e-4, (variant, token, err)
        print(variant, sink_aware, token, "rollout max|d|", err)


@pytest.mark.parametrize("variant", ALIBI)
def test_alibi_pooled_region_and_induction_equal_dense(variant):
    res = result(variant)
    fast, dense = pooled(res, 1, cells=16), pooled(res, 1, cells=16, computation="dense")
    assert fast.path == "fused" and dense.path == "dense: asked"
    assert np.abs(fast.mean - dense.mean).max() <= 1e-5 and np.abs(fast.max - dense.max).max() <= 1e-5
    want = res.layer_tensor(1, rows=slice(40, 90))[:, :, 10:70].numpy()
    assert np.abs(region(res, 1, rows=slice(40, 90), cols=slice(10, 70)) - want).max() <= 1e-5
    copy = tuple(int(i) for i in np.random.default_rng(1).choice(np.arange(5, 250), 30, replace=False))
    probe = M.InductionProbe(
        result=attnviz.extract_ids(wrap(build(variant)[0]), [*copy, *copy]), random_ids=copy, seed=1
    )
    assert lse.key_bias(lse.captured(probe.result, "self", 0)) is not None
    ind = M.head_induction(probe), M.head_induction(probe, dense=True)
    assert np.abs(ind[0] - ind[1]).max() <= 1e-4


def test_a_query_dependent_bias_stays_dense():
    """A full (1, heads, N, N) bias (T5's relative positions) is not key-only: dense path."""
    res = result("bloom")
    cap = lse.captured(res, "self", 0)
    full = cap.position_bias.expand(1, res.n_heads, N, N).clone()
    full[..., 5, 2] += 0.5
    t5_like = dataclasses.replace(cap, position_bias=full)
    assert lse.key_bias(t5_like) is None
    assert lse.layer_spec(t5_like, res.layout, 0, "self") == (None, "position bias")
    res2 = res.with_capture(0, t5_like)
    hm = M.head_metrics(res2)
    assert hm.paths[0] == "dense: position bias" and set(hm.paths[1:]) == {"fused"}
    assert R.token_rollout(res2).paths[0] == "dense: position bias"
    # a wrong key length is refused the same way
    short = dataclasses.replace(cap, position_bias=cap.position_bias[..., :-1])
    assert lse.layer_spec(short, res.layout, 0, "self") == (None, "position bias")


def test_a_key_bias_under_grouped_query_attention_is_per_query_head():
    """GQA (tiny llama, 2 query heads per KV head) with a planted ALiBi-like bias whose slope
    differs between the heads of one group: the bias follows the query head everywhere,
    including the cross-entropy terms of GQA coherence."""
    from sharp_models import TEXT, sharp

    res = attnviz.extract(sharp("llama-gqa"), TEXT)
    caps = [res.captured(i) for i in range(res.n_layers())]
    h, n = caps[0].query.shape[1], caps[0].key.shape[2]
    assert h // caps[0].key.shape[1] > 1
    slopes = torch.tensor([2.0 ** -(i + 1) for i in range(h)])
    bias = (slopes[:, None] * torch.arange(n, dtype=torch.float32))[None, :, None, :]  # (1, h, 1, n)
    for i, c in enumerate(caps):
        res = res.with_capture(i, dataclasses.replace(c, position_bias=bias))
    fast, dense = M.head_metrics(res), M.head_metrics(res, computation="dense")
    assert fast.paths == ("fused",) * len(caps) and "gqa_coherence" in fast.metrics
    for m in fast.metrics:
        err = float(np.abs(fast.values(m) - dense.values(m)).max())
        assert err <= 1e-4 * (n if m == "distance" else 1), (m, err)
    plain = M.head_metrics(attnviz.extract(sharp("llama-gqa"), TEXT))
    assert np.abs(plain.entropy - fast.entropy).max() > 0.05  # the bias changes what is measured
    tr, td = R.token_rollout(res, sink_aware=True), R.token_rollout(res, sink_aware=True, computation="dense")
    assert tr.paths == ("fused",) * len(caps) and np.abs(tr.sources - td.sources).max() <= 1e-4


def test_falcon_alibi_per_head_mask_is_mask_plus_key_bias():
    """transformers' Falcon adds ALiBi into its causal mask too ((1, heads, N, N) float): the
    mask counts as causal + a key-only bias only when every allowed entry of a head equals that
    head's bias on the diagonal; one odd entry sends the layer to the dense path."""
    res = result("falcon-alibi")
    cap = lse.captured(res, "self", 0)
    assert cap.mask is not None and cap.mask.shape == (1, res.n_heads, N, N)
    want = cap.position_bias[0, :, 0] + cap.mask[0, :, -1]  # the last row sees every key
    assert torch.equal(lse.key_bias(cap), want)
    assert lse.layer_spec(cap, res.layout, 0, "self") == (lse.MaskSpec(True), "fused")
    odd = cap.mask.clone()
    odd[0, 2, 50, 7] += 0.25  # a query-dependent entry
    bad = dataclasses.replace(cap, mask=odd)
    assert lse.layer_spec(bad, res.layout, 0, "self") == (None, "mask")
    hole = cap.mask.clone()
    hole[0, 1, 50, 7] = torch.finfo(torch.float32).min  # a masked key inside the causal band
    assert lse.layer_spec(dataclasses.replace(cap, mask=hole), res.layout, 0, "self") == (None, "mask")
    res2 = res.with_capture(0, bad)
    fast, dense = M.head_metrics(res2), M.head_metrics(res2, computation="dense")
    assert fast.paths[0] == "dense: mask" and set(fast.paths[1:]) == {"fused"}
    for m in fast.metrics:
        assert np.abs(fast.values(m) - dense.values(m)).max() <= 1e-4, m
