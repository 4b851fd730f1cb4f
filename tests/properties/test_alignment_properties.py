"""Token alignment (`attnviz.analysis.align.align_tokens`) and patching's pairing of two prompts
(`attnviz.explain.patch_sites.pair`) over generated token sequences. No model: token ids from a
small vocabulary (so repeats and shared runs are common), display text derived from the ids."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st
from property_settings import examples

from attnviz.analysis.align import align_tokens
from attnviz.errors import AttnvizError
from attnviz.explain.patch_sites import pair
from attnviz.tokens import Tokens

WORDS = ["the", "The", " the", "bank", "river", "Bank ", "a", "of"]


def tokens(ids: list[int]) -> Tokens:
    shown = [WORDS[i % len(WORDS)] for i in ids]  # ids 0 and 8 show alike; 0, 1, 2 alike by text
    n = len(ids)
    return Tokens(tuple(ids), tuple(shown), tuple(shown), (False,) * n, (False,) * n, (False,) * n)


IDS = st.lists(st.integers(0, 11), min_size=0, max_size=24)


def increasing(xs) -> bool:
    return all(a < b for a, b in itertools.pairwise(xs))


@examples(150)
@given(a=IDS, b=IDS, by=st.sampled_from([None, "ids", "text"]))
def test_alignment_pairs_only_equal_tokens_in_order(a, b, by):
    """Property: `align_tokens` pairs positions in order on both sides (strictly increasing), within
    the sequences, and only tokens that are equal: the same id (``by="ids"``) or the same
    normalised display text (``by="text"``); the default picks one of the two."""
    ta, tb = tokens(a), tokens(b)
    al = align_tokens(ta, tb, by=by)
    assert (al.n_a, al.n_b) == (len(a), len(b))
    assert increasing(al.a) and increasing(al.b) and len(al.a) == len(al.b)
    assert all(0 <= i < len(a) for i in al.a) and all(0 <= j < len(b) for j in al.b)
    for i, j in al.pairs():
        if al.by == "ids":
            assert a[i] == b[j]
        else:
            assert ta.display[i].strip().lower() == tb.display[j].strip().lower()
    if by is None:
        assert al.by in ("ids", "text")
    assert 0.0 <= al.coverage <= 1.0


@examples(150)
@given(a=IDS, b=IDS)
def test_patching_pairs_two_prompts_the_same_way_in_both_directions(a, b):
    """Property: patching's pairing is symmetric: the pairs of ``pair(a, b)`` are those of
    ``pair(b, a)`` swapped (denoising and noising patch the same positions), both refuse together,
    and pairs are in order and in range; ``unpatched`` is what is left of the target."""
    try:
        ab = pair(tokens(a), tokens(b))
    except AttnvizError:
        ab = None
    try:
        ba = pair(tokens(b), tokens(a))
    except AttnvizError:
        ba = None
    assert (ab is None) == (ba is None)
    if ab is None or ba is None:
        return
    assert sorted(ab.pairs()) == sorted((s, t) for t, s in ba.pairs())
    assert increasing(ab.target) and increasing(ab.source)
    assert set(ab.unpatched) == set(range(len(a))) - set(ab.target)
    assert set(ab.differing) == {t for t, s in ab.pairs() if a[t] != b[s]}


@examples(100)
@given(a=st.lists(st.integers(0, 11), min_size=1, max_size=24))
def test_a_prompt_paired_with_itself_is_the_identity(a):
    """Property: a prompt paired with itself pairs every position with itself, none unpatched,
    none differing, all shared; and it aligns with itself completely."""
    p = pair(tokens(a), tokens(a))
    assert p.target == p.source == tuple(range(len(a)))
    assert p.unpatched == p.differing == ()
    assert p.shared == len(a)
    al = align_tokens(tokens(a), tokens(a))
    assert al.a == al.b == tuple(range(len(a))) and al.coverage == 1.0
