"""Notebook views: `head_view` / `model_view` draw the result's own numbers, and a result's cell
display is a summary plus the head view, bounded in size at 1000+ tokens."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import numpy as np
import plotly.graph_objects as go
import pytest
import tiny

import attnviz
from attnviz import figures as F
from attnviz.figures import notebook

SEED = "the financial bank is located on river bank"


@pytest.fixture(scope="module")
def res():
    return attnviz.extract(tiny.loaded("llama-gqa"), SEED)  # 3 layers x 4 heads, 2 KV heads


def z_of(trace) -> np.ndarray:
    return np.asarray(trace.z, dtype=np.float32)


def test_head_view_of_one_layer_draws_those_heads(res):
    fig = attnviz.head_view(res, layer=1, heads=[3, 0])
    assert isinstance(fig, go.Figure) and len(fig.data) == 2
    n = res.n_tokens
    for trace, head in zip(fig.data, [3, 0], strict=True):
        z = z_of(trace)
        assert z.shape == (n, n)  # a short text is not pooled
        np.testing.assert_array_equal(z, res.head(1, head))
        assert f"head {head}" in trace.name
    assert "layer 1" in fig.layout.title.text and "tiny-llama-gqa" in fig.layout.title.text
    labels = [F.escape(f"({i}) {t}") for i, t in enumerate(res.tokens.display)]  # escaped: tokens are text
    assert list(fig.data[0].x) == labels and list(fig.data[0].y) == labels


def test_head_view_of_every_layer_has_a_slider_over_the_right_layers(res):
    fig = attnviz.head_view(res)
    n_l, n_h = res.n_layers(), res.n_heads
    assert len(fig.data) == n_l * n_h
    steps = fig.layout.sliders[0].steps
    assert [s.label for s in steps] == [str(i) for i in range(n_l)]
    for layer, step in enumerate(steps):
        visible = step.args[0]["visible"]
        shown = [i for i, v in enumerate(visible) if v]
        assert shown == list(range(layer * n_h, (layer + 1) * n_h))
        assert f"layer {layer}" in step.args[1]["title.text"]
        for h, i in enumerate(shown):
            np.testing.assert_array_equal(z_of(fig.data[i]), res.head(layer, h))
    assert [t.visible for t in fig.data[:n_h]] == [None] * n_h  # layer 0 shows first
    assert all(t.visible is False for t in fig.data[n_h:])
    # one colour scale for every layer: the largest weight of the whole model
    assert fig.layout.coloraxis.cmax == pytest.approx(float(res.all_layers().max()))


def test_model_view_tiles_every_layer_and_head(res):
    fig = attnviz.model_view(res)
    assert isinstance(fig, go.Figure) and len(fig.data) == 1
    canvas = z_of(fig.data[0])
    n, n_l, n_h = res.n_tokens, res.n_layers(), res.n_heads
    assert n_l <= n_h  # rows are layers, columns heads; tiles are n x n with a one-cell gap
    assert canvas.shape == (n_l * (n + 1), n_h * (n + 1))
    for layer in range(n_l):
        for head in range(n_h):
            tile = canvas[layer * (n + 1) : layer * (n + 1) + n, head * (n + 1) : head * (n + 1) + n]
            np.testing.assert_array_equal(tile, res.head(layer, head))
    assert f"{n_l} layers × {n_h} heads" in fig.layout.title.text


def test_cross_attention_view_has_decoder_queries_and_encoder_keys():
    res = attnviz.extract(tiny.loaded("bart"), SEED)
    fig = attnviz.head_view(res, layer=0, stack="cross")
    q, k = res.axes("cross")
    z = z_of(fig.data[0])
    assert z.shape == (len(q), len(k))
    np.testing.assert_array_equal(z, res.head(0, 0, stack="cross"))
    assert "cross" in fig.layout.title.text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"layer": 3}, "layer 3 is out of range"),
        ({"layer": -1}, "layer -1 is out of range"),
        ({"heads": [4]}, "head 4 is out of range"),
        ({"heads": []}, "heads is empty"),
    ],
)
def test_bad_layer_or_head_is_a_clear_error(res, kwargs, message):
    with pytest.raises(attnviz.BadIndex, match=message):
        attnviz.head_view(res, **kwargs)


def test_cell_display_is_a_summary_and_the_head_view(res):
    bundle = res._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html", notebook.PLOTLY_MIME}
    text = bundle["text/plain"]
    assert "tiny-llama-gqa" in text and f"tokens: {res.n_tokens}:" in text
    assert "3 × 4 (2 KV heads, GQA)" in text
    page = bundle["text/html"]
    assert "<table>" in page and "cdn.plot.ly" in page and "financial" in page
    spec = bundle[notebook.PLOTLY_MIME]
    assert len(spec["data"]) == res.n_layers() * res.n_heads and spec["layout"]["sliders"]


def test_cell_display_escapes_token_text():
    lm = tiny.loaded("llama-gqa")
    res = attnviz.extract(lm, "<b>bold</b> & <script>x</script>")
    page = res._repr_mimebundle_()["text/html"]
    table = page.split("</table>")[0] + "</table>"

    class Tags(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags: set[str] = set()
            self.text = ""

        def handle_starttag(self, tag, attrs):
            self.tags.add(tag)

        def handle_data(self, data):
            self.text += data

    parsed = Tags()
    parsed.feed(table)
    assert parsed.tags == {"table", "tr", "th", "td"}  # the token text made no tags
    assert " ".join(res.tokens.display[:12]) in parsed.text


@pytest.mark.slow  # a 1,500-token extract, every layer pooled twice (~10 s on 2 cores)
def test_cell_display_of_1000_plus_tokens_is_under_5_mb(monkeypatch):
    lm = tiny.loaded("llama-gqa")
    text = " ".join(f"word{i % 97}" for i in range(400))
    res = attnviz.extract(lm, text, max_tokens=10_000)
    assert res.n_tokens >= 1000
    bundle = res._repr_mimebundle_()  # 3 layers x 4 heads: every layer, behind the slider
    size = sum(len(v if isinstance(v, str) else json.dumps(v)) for v in bundle.values())
    assert size < 5_000_000, size
    spec = bundle[notebook.PLOTLY_MIME]
    assert "max-pooled" in spec["layout"]["title"]["text"]
    assert len(spec["data"]) == res.n_layers() * res.n_heads and spec["layout"]["sliders"]
    # a bigger model (more layers x heads x tokens than the display computes quickly): one layer
    monkeypatch.setattr(notebook, "REPR_ALL_LAYERS_CELLS", res.n_tokens**2)
    bundle = res._repr_mimebundle_()
    spec = bundle[notebook.PLOTLY_MIME]
    assert "layer 1 · max-pooled" in spec["layout"]["title"]["text"]  # the middle layer
    assert len(spec["data"]) == res.n_heads and "sliders" not in spec["layout"]
    assert "shown: layer 1 of 3; attnviz.head_view(res) walks every layer" in bundle["text/plain"]
    assert sum(len(v if isinstance(v, str) else json.dumps(v)) for v in bundle.values()) < 5_000_000
