"""Compare done right: tokens aligned before diffing, two models compared by matched statistics."""

import numpy as np
import pytest
import tiny

import attnviz
from attnviz.analysis import align as A
from attnviz.errors import AttnvizError
from attnviz.tokens import Tokens

A_TEXT = "the bank is by the river"
B_TEXT = "oh the bank is by the river now"  # the same words with one inserted before, one after


VOCAB: dict[str, int] = {}  # one id per word across calls (hash() % 1000 differed per process and collided)


def toks(words: list[str], ids: list[int] | None = None) -> Tokens:
    n = len(words)
    return Tokens(
        ids=tuple(ids or [VOCAB.setdefault(w, len(VOCAB)) for w in words]),
        raw=tuple(words),
        display=tuple(words),
        special=(False,) * n,
        template=(False,) * n,
        generated=(False,) * n,
    )


def test_alignment_of_shared_words():
    a = toks(["the", "cat", "sat", "on", "the", "mat"])
    b = toks(["the", "big", "cat", "sat", "on", "a", "mat"])
    al = A.align_tokens(a, b)
    assert al.pairs() == [(0, 0), (1, 2), (2, 3), (3, 4), (5, 6)]
    assert al.coverage == pytest.approx(5 / 7)
    # by text: case and surrounding spaces do not matter, ids do not count
    c = toks([" The", "CAT"], ids=[1, 2])
    d = toks(["the", "cat"], ids=[7, 8])
    assert A.align_tokens(c, d, by="ids").pairs() == []
    assert A.align_tokens(c, d, by="text").pairs() == [(0, 0), (1, 1)]
    assert A.align_tokens(c, d).by == "text"


def test_inserted_token_gives_zero_aligned_diff_but_not_positional():
    rng = np.random.default_rng(0)
    pa = rng.random((2, 5, 5)).astype(np.float32)
    pb = np.insert(np.insert(pa, 1, 0.5, axis=1), 1, 0.5, axis=2)  # B: A with position 1 inserted
    a = toks(list("vwxyz"))
    b = toks(["v", "NEW", "w", "x", "y", "z"])
    al = A.align_tokens(a, b)
    assert al.pairs() == [(0, 0), (1, 2), (2, 3), (3, 4), (4, 5)]
    d = A.aligned_diff(pa, pb, al)
    assert d.shape == (2, 5, 5) and np.abs(d).max() == 0.0
    assert np.abs(pa - pb[:, :5, :5]).max() > 0.1  # position by position would be mostly noise


def test_head_changes_on_two_sentences_with_shared_words():
    lm = tiny.loaded("llama-gqa")
    ra, rb = attnviz.extract(lm, A_TEXT), attnviz.extract(lm, B_TEXT)
    al = A.align_tokens(ra.tokens, rb.tokens)
    # "the" opens A but follows a space in B (another BPE id): text alignment finds more pairs
    assert al.by == "text" and len(al) > len(A.align_tokens(ra.tokens, rb.tokens, by="ids"))
    assert len(al) >= len(ra.tokens) - 1  # every word of A found in B (all but A's <s>)
    for i, j in al.pairs():
        assert ra.tokens.display[i].strip().lower() == rb.tokens.display[j].strip().lower()
    got = A.head_changes(ra, rb, al)
    assert got.shape == (3, 4)
    # direct: mean over every aligned (query, key) pair of |A - B|
    for layer in range(3):
        la, lb = ra.layer(layer), rb.layer(layer)
        for h in range(4):
            pairs = al.pairs()
            want = np.mean([abs(la[h, qi, ki] - lb[h, qj, kj]) for qi, qj in pairs for ki, kj in pairs])
            assert got[layer, h] == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert got.max() > 0  # the inserted token changes the causal context
    same = A.head_changes(ra, attnviz.extract(lm, A_TEXT), A.align_tokens(ra.tokens, ra.tokens))
    assert same.max() <= 1e-6


def test_shared_prefix_rows_are_equal_under_causal_attention():
    lm = tiny.loaded("gpt2")
    ra = attnviz.extract(lm, "the bank is by the river")
    rb = attnviz.extract(lm, "the bank is by the sea and more")
    al = A.align_tokens(ra.tokens, rb.tokens)
    d = A.aligned_diff(ra.layer(2), rb.layer(2), al)
    prefix = [k for k, (i, j) in enumerate(al.pairs()) if i == j and i < 5]
    assert np.abs(d[:, prefix][:, :, prefix]).max() <= 1e-6


def test_two_models_with_different_shapes():
    ra = attnviz.extract(tiny.loaded("gemma2"), A_TEXT)  # 4 layers x 4 heads
    rb = attnviz.extract(tiny.loaded("gpt2"), A_TEXT)  # 3 layers x 4 heads
    with pytest.raises(AttnvizError, match="different layer/head counts"):
        A.head_changes(ra, rb, A.align_tokens(ra.tokens, rb.tokens))
    al = A.align_tokens(ra.tokens, rb.tokens)
    sim = A.head_similarity(ra, rb, al)
    assert sim.shape == (4, 4, 3, 4)
    pa, pb = A.aligned(ra.layer(1), al.a)[2].ravel(), A.aligned(rb.layer(0), al.b)[3].ravel()
    assert sim[1, 2, 0, 3] == pytest.approx(np.corrcoef(pa, pb)[0, 1], abs=1e-9)
    self_sim = A.head_similarity(ra, ra, A.align_tokens(ra.tokens, ra.tokens))
    assert np.allclose([self_sim[layer, h, layer, h] for layer in range(4) for h in range(4)], 1.0)
    best = A.best_matches(self_sim)
    assert all((la, ha) == (lb, hb) for la, ha, lb, hb, _ in best)


def test_layer_profiles_on_relative_depth():
    a = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])  # 3 layers: means 0, 1, 2
    b = np.array([[4.0], [3.0], [2.0], [1.0], [0.0]])  # 5 layers
    depth, pa, pb = A.layer_profiles(a, b, points=5)
    np.testing.assert_allclose(depth, [0, 0.25, 0.5, 0.75, 1])
    np.testing.assert_allclose(pa, [0, 0.5, 1, 1.5, 2])
    np.testing.assert_allclose(pb, [4, 3, 2, 1, 0])
