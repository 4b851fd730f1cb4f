"""Token views (lines between tokens, coloured text), colour scales, click targets; numbers drawn."""

import ast
import base64
import json
from pathlib import Path

import numpy as np
import pytest
import tiny

import attnviz
from attnviz import figures as F
from attnviz.analysis import token_views as TV
from attnviz.analysis import value_weighted as VW
from attnviz.figures import tokens as FT
from attnviz.inputs import first_tokens

TEXT = "the financial bank is located on river bank"


def spec(fig) -> dict:
    return json.loads(fig.to_json())


def arr(v) -> np.ndarray:
    """A figure array as numbers: Plotly writes numpy arrays as {"dtype", "bdata" (base64)}."""
    if isinstance(v, dict) and "bdata" in v:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        shape = v.get("shape")
        return a.reshape([int(x) for x in str(shape).split(",")]) if shape else a
    return np.asarray(v, dtype=float)


def by_name(fig, name: str) -> dict:
    return next(t for t in spec(fig)["data"] if t.get("name") == name)


def test_figure_package_files_are_small_and_pure():
    for path in Path(F.__file__).parent.glob("*.py"):
        text = path.read_text()
        assert len(text.splitlines()) < 400, path
        tree = ast.parse(text)
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(x.split(".")[0] == "streamlit" for x in names), path


def lines_of(fig) -> list[tuple[str, float, float]]:
    """(colour, left y, right y) of every drawn link (a line shape from x 0 to x 1)."""
    return [
        (sh["line"]["color"], sh["y0"], sh["y1"])
        for sh in spec(fig)["layout"].get("shapes", [])
        if sh.get("type") == "line" and (sh["x0"], sh["x1"]) == (0, 1)
    ]


def test_token_lines_draw_the_top_k_links_of_each_head():
    display = ["<s>", "a", "<b>", "c", "d"]
    rows = np.zeros((2, 5, 5), dtype=np.float32)
    rows[0, :, 0] = 1.0  # head 0: everything on the first token
    for i in range(5):
        rows[1, i, max(0, i - 1)] = 0.7  # head 1: previous token, plus a little on itself
        rows[1, i, i] += 0.3
    fig = F.token_lines(rows, display, list(range(5)), top_k=1)
    left = by_name(fig, "query tokens")
    assert left["text"][2] == "&lt;b&gt;" and "<b>" not in json.dumps(left["text"])
    assert [c[0] for c in left["customdata"]] == [0, 1, 2, 3, 4]
    segs = lines_of(fig)
    c0, c1 = F.head_colours(2)
    head0 = {(a, b) for col, a, b in segs if col.startswith(FT._rgba(c0, 0)[:-2])}
    head1 = {(a, b) for col, a, b in segs if col.startswith(FT._rgba(c1, 0)[:-2])}
    assert head0 == {(float(i), 0.0) for i in range(5)}
    assert head1 == {(float(i), float(max(0, i - 1))) for i in range(5)}
    only = F.token_lines(rows, display, list(range(5)), top_k=1, selected=3)
    assert {(a, b) for _, a, b in lines_of(only)} == {(3.0, 0.0), (3.0, 2.0)}


def test_token_lines_are_two_traces_whatever_the_heads_with_one_legend_entry_per_head():
    """Issue 40: the lines view was one scatter per (head, weight band): 18 scatters on a 9-head
    layer, each one Plotly's fixed cost. The links are shapes now (each its band's width and
    opacity), the tokens two traces; a head's legend entry still groups (and hides) its links."""
    rng = np.random.default_rng(0)
    rows = rng.dirichlet(np.full(40, 0.3), size=(9, 40)).astype(np.float32)  # (heads, rows, keys)
    fig = F.token_lines(rows, [f"t{i}" for i in range(40)], list(range(40)), top_k=3, selected=39)
    data, shapes = spec(fig)["data"], spec(fig)["layout"]["shapes"]
    assert [t["name"] for t in data] == ["query tokens", "key tokens"]
    links = [sh for sh in shapes if sh["x1"] == 1]
    top = np.sort(rows[:, 39, :], axis=-1)[:, ::-1][:, :3]  # each head's 3 strongest weights
    assert len(links) == int((top >= FT.LINE_LEVELS[0]).sum())
    for sh in links:
        assert sh["line"]["width"] in [w for _, w in FT._LEVEL_STYLE] and not sh["showlegend"]
    legend = [sh for sh in shapes if sh.get("showlegend")]  # every head once, in its full colour
    assert [sh["legendgroup"] for sh in legend] == [f"head {h}" for h in range(9)]
    assert [sh["line"]["color"] for sh in legend] == F.head_colours(9)
    assert {sh["legendgroup"] for sh in links} <= {sh["legendgroup"] for sh in legend}
    band = int(np.searchsorted(FT.LINE_LEVELS, top.max(), "right")) - 1
    assert max(sh["line"]["width"] for sh in links) == FT._LEVEL_STYLE[band][1]


def test_token_lines_window_lists_far_keys_after_a_gap():
    n = 2000
    rows = np.full((1, 5, n), 1e-6, dtype=np.float32)
    rows[0, :, 0] = 0.9  # a sink far outside the window
    positions = list(range(1000, 1005))
    fig = F.token_lines(rows, [f"t{i}" for i in range(n)], positions, top_k=2)
    keys = [c[0] for c in by_name(fig, "key tokens")["customdata"]]
    assert keys[0] == 0 and keys[1:] == positions
    gaps = [a for a in spec(fig)["layout"].get("annotations", []) if a["text"] == "⋯"]
    assert len(gaps) == 1
    assert F.payload_bytes(fig) < 200_000  # bounded at any N


def test_far_partners_are_labelled_with_their_position():
    """A partner outside the window (past the ⋯) says where the link goes: "(position) token",
    on both sides of the window, and its line ends at that label; tokens inside the window keep
    the bare token (their position is the row beside them). The hover names each token once."""
    n = 3000
    display = [f"t{i}" for i in range(n)]
    display[0], display[2999] = "<s>", "<end>"
    rows = np.full((2, 5, n), 1e-6, dtype=np.float32)
    rows[0, :, 0] = 0.9  # head 0: a sink before the window
    rows[1, :, 2999] = 0.8  # head 1: a partner after it
    positions = list(range(1500, 1505))
    fig = F.token_lines(rows, display, positions, top_k=1)
    right = by_name(fig, "key tokens")
    label = dict(zip([c[0] for c in right["customdata"]], right["text"], strict=True))
    assert label[0] == "(0) &lt;s&gt;" and label[2999] == "(2999) &lt;end&gt;"
    assert [label[p] for p in positions] == [f"t{p}" for p in positions]
    assert right["hovertext"][0] == "&lt;s&gt;" and "%{hovertext}" in right["hovertemplate"]
    y_of = dict(zip([c[0] for c in right["customdata"]], right["y"], strict=True))
    ends = {round(b, 6) for _, _, b in lines_of(fig)}
    assert ends == {y_of[0], y_of[2999]}  # every line ends at a labelled far partner
    assert y_of[0] < min(y_of[p] for p in positions) < max(y_of[p] for p in positions) < y_of[2999]


def test_token_text_colours_are_the_weights_and_click_targets_are_positions():
    w = np.array([0.5, 0.1, 0.3, 0.1], dtype=np.float32)
    disp = ["<i>x</i>", "b", "c↵", "d"]
    fig = F.token_text(w, disp, selected=2)
    bar = spec(fig)["data"][0]
    np.testing.assert_allclose(arr(bar["marker"]["color"]), w)
    assert [c[0] for c in bar["customdata"]] == [0, 1, 2, 3]
    assert bar["text"][0] == "&lt;i&gt;x&lt;/i&gt;"
    assert bar["marker"]["line"]["width"] == [0, 0, 3, 0]  # the selected token is framed
    assert bar["y"] == [0, 0, 0, 1]  # "↵" ends a line
    ranked = arr(spec(F.token_text(w, disp, scale="rank"))["data"][0]["marker"]["color"])
    assert ranked[0] == 1.0 and ranked[2] == 0.75
    logged = arr(spec(F.token_text(w, disp, scale="log"))["data"][0]["marker"]["color"])
    np.testing.assert_allclose(logged, np.log10(w), rtol=1e-6)
    html = F.token_text_html(w, disp, selected=0)
    assert "&lt;i&gt;x&lt;/i&gt;" in html and "<i>" not in html and "outline" in html


def test_token_text_long_text_shows_a_window_around_the_selected_token():
    n = 5000
    fig = F.token_text(np.full(n, 1 / n, dtype=np.float32), [f"w{i}" for i in range(n)], selected=4000)
    pos = [c[0] for c in spec(fig)["data"][0]["customdata"]]
    assert len(pos) == FT.TEXT_MAX_TOKENS and pos[0] <= 4000 <= pos[-1]
    assert "of 5000" in spec(fig)["layout"]["title"]["text"]


def test_rank_and_default_scales():
    z = np.array([[0.0, 0.2], [0.1, 0.7]], dtype=np.float32)
    np.testing.assert_allclose(F.rank_values(z), [[0, 2 / 3], [1 / 3, 1]])
    assert F.default_scale(100) == "linear" and F.default_scale(2000) == "log"
    assert "2000 tokens" in F.scale_note("log", 2000) and F.scale_note("linear", 10) == ""
    probs = np.array([[1.0, 0.0], [0.01, 0.99]], dtype=np.float32)
    heat = spec(F.head_heatmap(probs, ["a", "b"], scale="log"))["data"][0]
    np.testing.assert_allclose(arr(heat["z"]), [[0, -5], [-2, np.log10(0.99)]], atol=1e-6)
    with pytest.raises(ValueError, match="unknown colour scale"):
        F.head_heatmap(probs, ["a", "b"], scale="sqrt")


def test_grid_shares_the_view_scale_and_every_tile_picks_its_head():
    rng = np.random.default_rng(0)
    layer = rng.random((4, 6, 6)).astype(np.float32) * 0.3
    labels = F.token_labels(list("abcdef"))
    fig = F.head_grid(layer, labels, zmax=0.9, pickable=True)
    s = spec(fig)
    assert s["layout"]["coloraxis"]["cmax"] == 0.9  # the view's zmax, not the grid's own max
    picks = [t for t in s["data"] if t.get("name", "").startswith("tile")]
    assert [t["customdata"][0][0] for t in picks] == [0, 1, 2, 3]
    assert [t["xaxis"] for t in picks] == ["x", "x2", "x3", "x4"]
    # the click targets are invisible (a visible corner square read as an unticked checkbox)
    assert all(t["marker"]["opacity"] == 0 for t in s["data"] if t["type"] == "scatter")
    big = spec(F.head_heatmap(layer[2], labels, zmax=0.9))
    assert big["layout"]["coloraxis"]["cmax"] == 0.9


def test_mosaic_thumbnails_are_click_targets():
    images = np.random.default_rng(1).random((3, 2, 4, 4)).astype(np.float32)
    fig = F.model_mosaic(
        images, pickable=True, selected=(1, 0), layer_names=["layer 0", "layer 5", "layer 9"]
    )
    tiles = by_name(fig, "tiles")
    assert tiles["customdata"] == [[layer, head] for layer in range(3) for head in range(2)]
    assert "layer 5 · head 1" in tiles["text"]
    assert by_name(fig, "selected head")["x"] == [tiles["x"][2]]  # (1, 0) is the third tile


def test_token_rows_from_and_to_match_the_layer():
    lm = tiny.loaded("llama-gqa")
    res = attnviz.extract(lm, TEXT)
    full = res.layer(1)
    n = full.shape[-1]
    win = TV.window(n, 5, half=2)
    assert win == [3, 4, 5, 6, 7]
    np.testing.assert_array_equal(TV.token_rows(res, 1, win), full[:, 3:8])
    cols = TV.token_rows(res, 1, [0, 4], direction="to")
    np.testing.assert_array_equal(cols, full[:, :, [0, 4]].transpose(0, 2, 1))
    scattered = TV.token_rows(res, 1, [6, 2], heads=[3])
    np.testing.assert_allclose(scattered, full[[3]][:, [6, 2]], atol=1e-6)  # single rows: other matmul
    vw = VW.value_weighted(lm, res, 1)
    np.testing.assert_allclose(TV.token_rows(res, 1, win, lm=lm), vw[:, 3:8], rtol=1e-6)
    np.testing.assert_allclose(
        TV.token_rows(res, 1, [4], direction="to", lm=lm)[:, 0], vw[:, :, 4], rtol=1e-6
    )
    np.testing.assert_allclose(TV.token_weights(res, 1, 5, head=2), full[2, 5], atol=1e-6)
    np.testing.assert_allclose(TV.token_weights(res, 1, 5, direction="to"), full[:, :, 5].mean(0), rtol=1e-6)
    with pytest.raises(attnviz.AttnvizError, match="out of range"):
        TV.token_rows(res, 1, [n])


def test_first_tokens_cuts_at_a_token_boundary():
    lm = tiny.loaded("llama-gqa")
    long = "the financial bank is located on river bank " * 20
    cut = first_tokens(lm, long, 50)
    ids = attnviz.tokenize(lm, cut)[0]
    assert len(ids) <= 50 and len(ids) >= 48 and long.startswith(cut)
    assert ids == attnviz.tokenize(lm, long)[0][: len(ids)]  # the same tokens as the long text's start
    assert first_tokens(lm, "short text", 50) == "short text"


def test_html_page_carries_plotly_js_once():
    from ui import export

    figs = [
        F.head_grid(
            np.random.default_rng(0).random((4, 8, 8)).astype(np.float32), F.token_labels(list("abcdefgh"))
        )
    ]
    one = export.html_page(figs, "one")
    three = export.html_page(figs * 3, "<three>")
    assert len(three) - len(one) < 3 * 200_000 < len(one)  # plotly.js (~4.6 MB) once, not three times
    assert three.count(b"Plotly.newPlot") == 3 and b"&lt;three&gt;" in three
    cdn = export.html_page(figs * 3, "cdn", cdn=True)
    assert len(cdn) < 300_000 and b"cdn.plot.ly" in cdn
