"""`QKAttribution.by_band`: each QK term split by rotary band, the bands summing to the term.

Per band, the terms over every (query part, key part) add up to that band's share of the whole
score; the oracle computes that share from the hooked q and k after transformers' own RoPE
(tests/engine/qk_oracle.py, `vectors`), pairing dims m and m + rot/2 as Llama / NeoX do, the dims
past ``rot`` being the unrotated band. Interleaved pairs (Cohere) are checked against
`attnviz.explain.rotary_bands`, which reads the captured q and k by pair. fp32; 1e-4 relative.
"""

from __future__ import annotations

import numpy as np
import pytest
import qk_oracle
import tiny_explain as te

import attnviz
from attnviz.explain import qk_attribution, rotary_bands

TOL = 1e-4


def _all_band_totals(cell) -> np.ndarray:
    """(bands,) Σ over every term of each band's piece."""
    n = len(cell.components)
    return cell.bands.terms([(a, b) for a in range(n) for b in range(n)]).sum(1)


@pytest.mark.parametrize(("model_type", "overrides"), [("llama", {}), ("gpt_neox", {"rotary_pct": 0.5})])
def test_band_totals_match_the_hooked_q_and_k_pair_by_pair(model_type, overrides):
    lm = te.build(model_type, **overrides)
    tr = attnviz.explain.trace(lm, te.TEXT)
    q, k, scaling = qk_oracle.vectors(lm.model, list(tr.tokens.ids), 1)
    cell = qk_attribution(lm, tr, layer=1, head=1, query=-1, key=4)
    d, rot = q.shape[-1], int(tr.rotary[1][0].shape[-1])
    prod = scaling * (q[1, cell.query].double() * k[1, cell.key].double()).numpy()
    want = [prod[m] + prod[m + rot // 2] for m in range(rot // 2)]
    if rot < d:
        want.append(prod[rot:].sum())
        assert cell.bands.labels[-1] == "no rotation"
    got = _all_band_totals(cell)
    assert len(got) == len(want)
    np.testing.assert_allclose(got, want, atol=TOL * max(1.0, abs(cell.score)))


def test_each_top_term_is_the_sum_of_its_bands():
    lm = te.build("qwen3")  # q/k norms before RoPE
    tr = attnviz.explain.trace(lm, te.TEXT)
    cell = qk_attribution(lm, tr, layer=1, head=2, query=-1, key=3)
    labels, pairs, values = cell.by_band(5)
    assert values.shape == (len(labels), 5) and len(pairs) == 5
    top = cell.top(5)
    assert pairs == [(a, b) for a, b, _ in top]
    np.testing.assert_allclose(values.sum(0), [v for _, _, v in top], atol=1e-9)
    assert labels[0].startswith("band 0 (λ")  # the fastest pair first, as the rotary view numbers them


def test_interleaved_pairs_agree_with_the_rotary_view():
    lm = te.build("cohere")  # dims 2m and 2m + 1 turn together
    tr = attnviz.explain.trace(lm, te.TEXT)
    cell = qk_attribution(lm, tr, layer=1, head=0, query=-1, key=2)
    rb = rotary_bands(lm, tr, layer=1, head=0, query=-1, key=2)
    got = _all_band_totals(cell)
    scale = max(1.0, abs(cell.score))
    assert rb.spec.pairing == "interleaved" and len(got) == len(rb.pair_terms) + bool(rb.spec.rest)
    np.testing.assert_allclose(got[: len(rb.pair_terms)], rb.pair_terms, atol=TOL * scale)
    assert got[len(rb.pair_terms) :].sum() == pytest.approx(rb.rest_term, abs=TOL * scale)


def test_without_rotary_tables_there_is_one_band():
    lm = te.build("bloom")  # ALiBi
    cell = qk_attribution(lm, te.TEXT, layer=1, head=0, query=-1, key=2)
    labels, _pairs, values = cell.by_band(3)
    assert labels == ("no rotation",)
    np.testing.assert_allclose(values[0], [v for _, _, v in cell.top(3)], atol=1e-9)
