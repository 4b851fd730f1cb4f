"""What a figure shows a reader (issue 31): the logit lens labels every layer and does not cut
short tokens; value-weighted figures name their colour."""

from __future__ import annotations

import numpy as np

import attnviz
from attnviz import figures as F
from attnviz.explain.lens import LogitLens
from attnviz.tokens import Tokens


def lens_of(n_layers: int, n_pos: int, token: str) -> LogitLens:
    rows, k = n_layers + 1, 2
    flags = (False,) * n_pos
    toks = Tokens((0,) * n_pos, (token,) * n_pos, (token,) * n_pos, flags, flags, flags)
    return LogitLens(
        model_name="m",
        tokens=toks,
        positions=tuple(range(n_pos)),
        top_ids=np.zeros((rows, n_pos, k), dtype=np.int64),
        top_probs=np.full((rows, n_pos, k), 0.5, dtype=np.float32),
        top_tokens=tuple(tuple((token, "x") for _ in range(n_pos)) for _ in range(rows)),
        predicted=np.zeros(n_pos, dtype=np.int64),
        predicted_tokens=(token,) * n_pos,
        rank=np.zeros((rows, n_pos), dtype=np.int64),
        prob=np.full((rows, n_pos), 0.5, dtype=np.float32),
    )


def test_the_logit_lens_labels_every_layer_and_keeps_tokens_whole():
    fig = attnviz.lens_view(lens_of(30, 16, "financial"))
    assert list(fig.layout.yaxis.ticktext) == [
        "embeddings",
        *(f"after layer {i}" for i in range(29)),
        "final",
    ]
    assert fig.data[0].text[0][0] == "financial"  # 9 characters at 16 positions: whole


def test_value_name_on_the_colour_bar_and_hover():
    probs = np.eye(3, dtype=np.float32)
    fig = F.head_heatmap(probs, ["a", "b", "c"], value="‖α·W_O v‖")
    assert fig.layout.coloraxis.colorbar.title.text == "‖α·W_O v‖"
    assert "‖α·W_O v‖ %{z" in fig.data[0].hovertemplate
    grid = F.head_grid(probs[None], ["a", "b", "c"], value="‖α·W_O v‖")
    assert grid.layout.coloraxis.colorbar.title.text == "‖α·W_O v‖"


def test_the_hover_view_carries_the_exact_weights_and_escapes_tokens():
    import base64
    import re

    w = np.random.default_rng(0).random((3, 3)).astype(np.float32)
    page = F.hover_text_html(w, ["<b>", "a", "b"], start=1)
    data = re.search(r'atob\("([^"]+)"\)', page).group(1)
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(data), dtype="<f4").reshape(3, 3), w)
    assert "&lt;b&gt;" in page and "<b>" not in page.split("<body")[1].split("<script")[0]


def test_the_hover_text_wraps_between_tokens():
    """Caught: the tokens as adjacent no-wrap spans, so a long text ran off the frame on one line."""
    tokens = ["The", " old", " lighthouse", " keeper"]
    page = F.hover_text_html(np.eye(4, dtype=np.float32), tokens)
    body = page.split("<body")[1].split("<script")[0]
    assert body.count("</span><wbr><span") == len(tokens) - 1
    assert "white-space: pre;" not in page  # spaces inside a token may break too


def test_grid_tiles_are_square_for_square_matrices():
    """Tall narrow tiles with empty space beside them: a square matrix gets a square tile."""
    layer = np.random.default_rng(2).random((4, 6, 6)).astype(np.float32)
    fig = F.head_grid(layer, F.token_labels(list("abcdef")))
    assert fig.layout.yaxis.scaleanchor == "x" and fig.layout.yaxis4.scaleanchor == "x"


def test_grid_marks_the_open_head():
    """Issue 40: the tile open large was never marked in the grid; ``open_head`` frames its facet."""
    layer = np.random.default_rng(3).random((6, 5, 5)).astype(np.float32)
    fig = F.head_grid(layer, list("abcde"), open_head=4)
    frames = [s for s in fig.layout.shapes if s.name == "open head"]
    assert len(frames) == 1 and frames[0].xref == "x5 domain" and frames[0].yref == "y5 domain"
    assert not F.head_grid(layer, list("abcde")).layout.shapes


def test_grid_tiles_fill_the_space_they_are_given():
    """Issue 40: ~40 px tiles with wide gaps in a 400 px column. `grid_shape` fits square tiles
    to the space, and each facet's range is its matrix (the click targets' markers padded the
    autorange, shrinking every tile inside its cell)."""
    kv = [0, 0, 0, 1, 1, 1, 2, 2, 2]
    cols, tile = F.grid_shape(9, 400, 400, kv, colorbar=False)
    assert cols == 3 and tile >= 95  # one KV group per row, each tile ~a third of the width
    assert F.grid_shape(12, 400, 400)[1] >= 80
    layer = np.random.default_rng(4).random((9, 30, 30)).astype(np.float32)
    labels = [f"t{i}" for i in range(30)]
    fig = F.head_grid(layer, labels, kv_heads=kv, cols=cols, facet_px=tile, pickable=True, colorbar=False)
    assert fig.layout.height <= 400
    for i in ("", "5", "9"):
        assert tuple(fig.layout[f"xaxis{i}"].range) == (-0.5, 29.5)
        assert tuple(fig.layout[f"yaxis{i}"].range) == (29.5, -0.5)  # query 0 on top


def test_grid_token_labels_only_where_they_fit():
    """Issue 40: 16 labels on a ~100 px tile lay on top of each other. Labels need 12 px a row."""
    layer = np.random.default_rng(5).random((4, 16, 16)).astype(np.float32)
    labels = [f"t{i}" for i in range(16)]
    crowded = F.head_grid(layer, labels, facet_px=100)
    assert not any(ax.showticklabels for ax in crowded.select_xaxes()) | any(
        ax.showticklabels for ax in crowded.select_yaxes()
    )
    roomy = F.head_grid(layer, labels, facet_px=16 * 12)
    assert any(ax.showticklabels for ax in roomy.select_yaxes())
    assert not F.labels_fit(16, 100) and F.labels_fit(8, 100)
