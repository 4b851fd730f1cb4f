"""Generation by sampling beside greedy: seeded, reproducible, validated."""

import pytest
import tiny

import attnviz
from attnviz.extract import Sampling

TEXT = "the bank of the river"


def generated(res) -> list[int]:
    return [i for i, g in zip(res.tokens.ids, res.tokens.generated, strict=True) if g]


def test_sampling_is_seeded_and_differs_from_greedy():
    lm = tiny.loaded("llama-gqa")
    greedy = generated(attnviz.extract(lm, TEXT, generate=8))
    a = generated(
        attnviz.extract(lm, TEXT, generate=8, sampling=Sampling(temperature=1.5, top_p=1.0, seed=1))
    )
    b = generated(
        attnviz.extract(lm, TEXT, generate=8, sampling=Sampling(temperature=1.5, top_p=1.0, seed=1))
    )
    c = generated(
        attnviz.extract(lm, TEXT, generate=8, sampling=Sampling(temperature=1.5, top_p=1.0, seed=2))
    )
    assert len(a) == 8 and a == b  # same seed, same tokens
    assert a != c and a != greedy  # another seed, or greedy, gives other tokens
    assert generated(attnviz.extract(lm, TEXT, generate=8)) == greedy  # greedy is unchanged after a draw
    # top-p this small keeps only the most likely token: sampling becomes greedy
    narrow = Sampling(temperature=1.0, top_p=1e-6, seed=3)
    assert generated(attnviz.extract(lm, TEXT, generate=8, sampling=narrow)) == greedy


def test_bad_sampling_settings_are_refused():
    with pytest.raises(attnviz.AttnvizError, match="temperature > 0"):
        Sampling(temperature=0.0)
    with pytest.raises(attnviz.AttnvizError, match="top-p"):
        Sampling(top_p=1.5)
