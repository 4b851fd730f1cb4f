"""Head search: every head's α from one query to one key, and to the previous occurrence of the
current token, against the eager path's full maps; and only one query row per layer is computed."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_explain as TE

import attnviz
from attnviz import AttnvizError
from attnviz.explain.search import previous_occurrence_heads, previous_occurrences, search_heads

TEXT = "the bank and the river bank and the bank of the river"


@pytest.fixture(scope="module")
def results():
    lm = TE.loaded("llama-gqa")
    return attnviz.extract(lm, TEXT), attnviz.extract(lm, TEXT, path="eager")


def test_search_ranks_every_head_by_its_exact_alpha(results):
    fast, eager = results
    q, k = fast.n_tokens - 1, 2
    found = search_heads(fast, q, k)
    want = np.stack([eager.layer(layer)[:, q, k] for layer in range(eager.n_layers())])
    assert np.allclose(found.scores, want, atol=1e-6)
    ranked = found.ranking()
    assert len(ranked) == want.size and ranked[0][2] == found.scores.max()
    assert [s for *_, s in ranked] == sorted(found.scores.ravel(), reverse=True)
    assert (ranked[0][0], ranked[0][1]) == np.unravel_index(want.argmax(), want.shape)
    assert len(found.to_frame()) == want.size
    with pytest.raises(AttnvizError, match="after query"):
        search_heads(fast, 2, 5)


def test_search_computes_one_query_row_per_layer(results, monkeypatch):
    fast, _ = results
    asked = []
    real = attnviz.AttentionResult.layer_tensor

    def spy(self, layer, **kw):
        asked.append(kw.get("rows"))
        return real(self, layer, **kw)

    monkeypatch.setattr(attnviz.AttentionResult, "layer_tensor", spy)
    search_heads(fast, 7, 3)
    assert asked == [slice(7, 8)] * fast.n_layers()


def test_previous_occurrence_heads_average_the_exact_alpha(results):
    fast, eager = results
    ids = list(fast.tokens.ids)
    pairs = previous_occurrences(ids)
    assert pairs and all(ids[t] == ids[j] and j < t for t, j in pairs)
    assert all(ids[t] not in ids[j + 1 : t] for t, j in pairs)  # the latest earlier occurrence
    found = previous_occurrence_heads(fast)
    want = np.stack(
        [
            np.mean([eager.layer(layer)[:, t, j] for t, j in pairs], axis=0)
            for layer in range(eager.n_layers())
        ]
    )
    assert np.allclose(found.scores, want, atol=1e-6)
    induction = previous_occurrence_heads(fast, offset=1)
    assert all(ids[t] == ids[j - 1] for t, j in induction.rows)
    with pytest.raises(AttnvizError, match="occurs twice"):
        previous_occurrence_heads(attnviz.extract(TE.loaded("llama-gqa"), "a quick brown fox"))


def test_previous_occurrences_pair_each_repeat_with_an_earlier_token():
    """(t, j): j is the latest earlier occurrence of t's token (offset 1: the token after it, what
    an induction head reads), always before t. Caught: an immediate repeat "x x" paired its second
    token with itself under offset 1."""
    ids = [5, 5, 7, 5, 7]
    assert previous_occurrences(ids) == [(1, 0), (3, 1), (4, 2)]
    assert previous_occurrences(ids, offset=1) == [(3, 2), (4, 3)]
