"""Every source of a layer's probabilities (`attnviz.exact.sources`: `Captured` with its log
tiles on the fast path, `Stored` on the eager path) against the readable reference
(`attnviz.reference.attention.attention_probabilities` on the layer's captured Q and K), over
generated heads, row slices and tile rectangles. Results are extracted once per module."""

from __future__ import annotations

import pytest
import tiny_explain as TE
import torch
from hypothesis import given
from hypothesis import strategies as st
from property_settings import examples
from reference_call import reference_of

import attnviz

MODELS = ("llama-gqa", "mistral-sliding", "gemma2")  # grouped K/V heads, a sliding window, soft-capping
CLOSE = dict(atol=2e-6, rtol=1e-5)


@pytest.fixture(scope="module")
def results() -> dict:
    """Per model: the fast result, the eager result and each layer's reference."""
    out = {}
    for name in MODELS:
        lm = TE.loaded(name)
        fast = attnviz.extract(lm, TE.TEXT)
        eager = attnviz.extract(lm, TE.TEXT, path="eager")
        refs = [reference_of(fast.captured(layer, "self")) for layer in range(fast.n_layers())]
        out[name] = (fast, eager, refs)
    return out


@examples(60)
@given(data=st.data())
def test_every_source_equals_the_reference_on_any_rows_heads_and_tiles(results, data):
    """Property: for any layer, subset of heads and row slice, the fast path's `Captured` source
    and the eager path's `Stored` source give the reference's rows (float32, atol 2e-6, rtol
    1e-5); and where log tiles exist, exp of any rectangle of log p = s − L is the reference's
    rectangle (masked keys: exp(−inf) = 0). Regime: grouped K/V heads (4 heads on 2), a sliding
    window of 4 shorter than the text, soft-capped scores."""
    name = data.draw(st.sampled_from(MODELS))
    fast, eager, refs = results[name]
    layer = data.draw(st.integers(0, len(refs) - 1))
    ref = refs[layer]
    n_heads, n, _ = ref.shape
    heads = data.draw(st.lists(st.integers(0, n_heads - 1), min_size=1, max_size=n_heads, unique=True))
    a = data.draw(st.integers(0, n - 1))
    b = data.draw(st.integers(a + 1, n))
    for res in (fast, eager):
        got = res.source(layer).probabilities(heads, slice(a, b)).float().cpu()
        torch.testing.assert_close(got, ref[heads, a:b], **CLOSE)
    tiles, why = fast.source(layer).log_tiles(heads)
    if tiles is None:
        assert why
        return
    c = data.draw(st.integers(0, n - 1))
    cols = data.draw(st.integers(1, n - c))
    scores = tiles.scores(a, b - a, c, cols).float().cpu()
    got = torch.exp(scores - tiles.lse.float().cpu()[:, a:b, None])
    torch.testing.assert_close(got, ref[heads, a:b, c : c + cols], **CLOSE)
