"""Pure figure builders: facets, labels, escaping, downsampling and the browser payload budget."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

from attnviz import figures as F


def causal(n: int, heads: int = 1, seed: int = 0) -> np.ndarray:
    """Random causal attention (heads, n, n): rows sum to 1, nothing above the diagonal."""
    rng = np.random.default_rng(seed)
    a = np.tril(rng.random((heads, n, n), dtype=np.float32) + 1e-3)
    return (a / a.sum(-1, keepdims=True)).astype(np.float32)


def spec(fig) -> dict:
    return json.loads(fig.to_json())


def test_figures_do_not_import_streamlit():
    """Pure builders: the module imports no UI (the package-wide check runs `import attnviz`)."""
    here = Path(F.__file__)
    files = sorted(here.parent.glob("*.py")) if here.name == "__init__.py" else [here]  # a package
    names: set[str] = set()
    for file in files:
        tree = ast.parse(file.read_text())
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(name.split(".")[0] == "streamlit" for name in names), names


def test_token_labels_keep_positions_and_stay_distinct():
    labels = F.token_labels(["bank", "of", "the", "bank"])
    assert labels == ["(0) bank", "(1) of", "(2) the", "(3) bank"]
    assert F.token_labels(["a", "b"], positions=[3, 7]) == ["(3) a", "(7) b"]
    fig = F.head_heatmap(causal(4)[0], labels)
    heat = spec(fig)["data"][0]
    assert heat["x"] == heat["y"] == labels and len(set(heat["x"])) == 4  # repeated "bank" not merged
    assert spec(fig)["layout"]["xaxis"]["type"] == "category"


def test_labels_and_titles_are_escaped():
    labels = F.token_labels(["<b>x</b>", "a&b", "<br>"])
    fig = F.head_heatmap(causal(3)[0], labels, title="<i>model</i>")
    s = spec(fig)
    heat = s["data"][0]
    assert heat["x"] == ["(0) &lt;b&gt;x&lt;/b&gt;", "(1) a&amp;b", "(2) &lt;br&gt;"]
    assert "<b>" not in json.dumps(heat["x"]) and "<br>" not in json.dumps(heat["y"])
    assert s["layout"]["title"]["text"] == "&lt;i&gt;model&lt;/i&gt;"
    grid = F.head_grid(causal(3, heads=2), labels, titles=["<b>h0</b>", "h1"])
    assert "&lt;b&gt;h0&lt;/b&gt;" in [a["text"] for a in spec(grid)["layout"]["annotations"]]


def test_hover_names_query_key_and_weight():
    heat = spec(F.head_heatmap(causal(3)[0], F.token_labels(list("abc"))))["data"][0]
    assert "query %{y}" in heat["hovertemplate"] and "key %{x}" in heat["hovertemplate"]
    assert "weight %{z" in heat["hovertemplate"]


def test_grid_has_one_heatmap_per_head_grouped_by_kv_head():
    kv = [0, 0, 0, 1, 1, 1, 2, 2, 2]
    fig = F.head_grid(causal(6, heads=9), F.token_labels(list("abcdef")), kv_heads=kv)
    s = spec(fig)
    heats = [t for t in s["data"] if t["type"] == "heatmap"]
    assert len(heats) == 9
    titles = [a["text"] for a in s["layout"]["annotations"]]
    assert titles[4] == "head 4 · kv 1"
    # one KV group per row: 3 columns, so head 3 starts the second row (its x axis is the 4th)
    assert heats[3]["xaxis"] == "x4" and heats[2]["xaxis"] == "x3"
    assert {t["coloraxis"] for t in heats} == {"coloraxis"}  # one shared colour scale


def test_grid_without_gqa_wraps_at_four_columns():
    fig = F.head_grid(causal(5, heads=12), F.token_labels(list("abcde")))
    assert len(fig.data) == 12
    assert fig.layout.annotations[4].text == "head 4"


def test_log_colour_transforms_z_and_labels_the_colour_bar():
    p = causal(4)[0]
    p[3, 0] = 1e-9  # below the floor: drawn at the floor
    labels = F.token_labels(list("abcd"))
    fig = F.head_heatmap(p, labels, log=True)
    z = np.asarray(fig.data[0].z, dtype=np.float64)
    want = np.clip(np.log10(np.maximum(p.astype(np.float64), 10.0**F.LOG_FLOOR_EXP)), F.LOG_FLOOR_EXP, 0)
    np.testing.assert_allclose(z, want, atol=1e-6)
    assert z[0, 1] == F.LOG_FLOOR_EXP and z[3, 0] == F.LOG_FLOOR_EXP  # masked 0 and 1e-9
    assert z[0, 0] == 0.0  # row 0 of a causal pattern: weight 1 on itself
    s = spec(fig)
    bar = s["layout"]["coloraxis"]["colorbar"]
    assert bar["ticktext"][-1] == "1" and bar["ticktext"][0] == f"1e{F.LOG_FLOOR_EXP}"
    assert "log₁₀" in s["data"][0]["hovertemplate"]
    linear = np.asarray(F.head_heatmap(p, labels).data[0].z, dtype=np.float64)
    np.testing.assert_array_equal(linear, p)  # without log the weights are drawn as they are
    grid = F.head_grid(causal(4, heads=2), labels, log=True)
    for h, trace in enumerate(grid.data):
        np.testing.assert_allclose(
            np.asarray(trace.z, dtype=np.float64),
            np.log10(np.maximum(causal(4, heads=2)[h], 10.0**F.LOG_FLOOR_EXP)),
            atol=1e-6,
        )


def test_bin_edges_cover_every_position():
    for n, bins in [(10, 3), (7, 7), (5, 9), (4096, 128), (1000, 999)]:
        e = F.bin_edges(n, bins)
        assert e[0] == 0 and len(e) == min(n, bins) and np.all(np.diff(e) > 0) and e[-1] < n


def test_pool_max_and_mean_match_blocks():
    a = np.arange(36, dtype=np.float32).reshape(6, 6)
    rows, cols = np.array([0, 2, 4]), np.array([0, 3])
    m = F.pool(a, rows, cols, "max")
    assert m.shape == (3, 2) and m[0, 0] == a[:2, :3].max() and m[2, 1] == a[4:, 3:].max()
    mean = F.pool(a, rows, cols, "mean")
    assert mean[1, 1] == pytest.approx(a[2:4, 3:].mean())
    with pytest.raises(ValueError):
        F.pool(a, rows, cols, "median")


def test_downsampling_keeps_a_single_strong_weight_visible():
    p = np.zeros((1000, 1000), dtype=np.float32)
    p[777, 3] = 1.0
    pooled, re, ce = F.downsample(p, 100)
    assert pooled.shape == (100, 100) and pooled.max() == 1.0
    r, c = np.unravel_index(pooled.argmax(), pooled.shape)
    assert re[r] <= 777 < (re[r + 1] if r + 1 < len(re) else 1000) and ce[c] <= 3


def test_pooled_rows_equals_pooling_the_whole_matrix():
    p = causal(300, heads=3)
    calls = []

    def get_rows(sl: slice) -> np.ndarray:
        calls.append(sl)
        return p[:, sl]

    pooled, re, ce = F.pooled_rows(get_rows, 300, 300, 64, chunk_cells=3 * 300 * 20)
    whole = F.pool(p, re, ce, "max")
    np.testing.assert_array_equal(pooled, whole)
    assert len(calls) > 1 and all(sl.stop - sl.start <= 60 for sl in calls)  # 20 x 300 cells a chunk


def test_bin_labels_name_the_positions_of_each_bin():
    labels = F.token_labels(["the", "bank", "of", "the", "river"])
    assert F.bin_labels(labels, np.array([0, 2, 4])) == ["(0–1) the…", "(2–3) of…", "(4) river"]
    assert F.bin_labels(labels, np.arange(5)) == labels


def test_single_head_pools_above_its_cell_budget():
    n = 2000
    p = causal(n)[0]
    fig = F.head_heatmap(p, F.token_labels(["t"] * n))
    z = fig.data[0].z
    assert np.asarray(z).size <= F.SINGLE_MAX_CELLS
    assert "max-pooled" in fig.layout.title.text

    # the labels name the bins, and each drawn cell is the max of the positions its labels name
    # (the old last assert, "labels stay distinct", held for any bins: they carry positions)
    def starts(axis) -> np.ndarray:
        return np.array([int(str(t).split(")")[0].strip("(").split("–")[0]) for t in axis])

    re, ce = starts(fig.data[0].y), starts(fig.data[0].x)
    assert re[0] == ce[0] == 0 and len(re) * len(ce) == np.asarray(z).size
    bounds_r, bounds_c = [*re, n], [*ce, n]
    by_rows = np.stack([p[bounds_r[a] : bounds_r[a + 1]].max(0) for a in range(len(re))])  # (row bins, n)
    want = np.stack([by_rows[:, bounds_c[b] : bounds_c[b + 1]].max(1) for b in range(len(ce))], 1)
    np.testing.assert_allclose(np.asarray(z, dtype=np.float64), want, atol=1e-6)


def test_explorer_view_payload_under_5_mb_at_4096_tokens():
    """What the explorer sends for one view at N=4096: the grid (9 heads pooled) and the single
    head's row window (keys pooled); together under 5 MB."""
    n, heads = 4096, 9
    labels = F.token_labels([f"tok{i}" for i in range(n)])
    rng = np.random.default_rng(0)
    side = F.grid_side(heads)
    grid_in = rng.random((heads, side, side), dtype=np.float32)  # as pooled_rows returns it
    edges = F.bin_edges(n, side)
    grid = F.head_grid(grid_in, F.bin_labels(labels, edges), kv_heads=[h // 3 for h in range(heads)])
    w = F.SINGLE_MAX_CELLS // F.SINGLE_MAX_KEYS
    window = rng.random((w, n), dtype=np.float32)
    single = F.head_heatmap(window, labels[:w], labels)
    total = F.payload_bytes(grid) + F.payload_bytes(single)
    assert total < F.PAYLOAD_LIMIT, total
    assert F.payload_bytes(single) < 3_500_000


def test_mosaic_of_30_layers_by_9_heads_fits_the_budget():
    layers, heads, n = 30, 9, 4096
    side = F.mosaic_side(layers, heads)
    images = np.random.default_rng(1).random((layers, heads, side, side), dtype=np.float32)
    labels = F.bin_labels(F.token_labels(["w"] * n), F.bin_edges(n, side))
    fig = F.model_mosaic(images, q_labels=labels, k_labels=labels)
    assert F.payload_bytes(fig) < 3_000_000
    s = spec(fig)
    heat = s["data"][0]
    assert len(set(heat["x"])) == len(heat["x"]) and len(set(heat["y"])) == len(heat["y"])
    # 30 layers > 9 heads: layers run across, tiles are square
    assert s["layout"]["xaxis"]["ticktext"][-1] == "L29" and s["layout"]["yaxis"]["ticktext"][-1] == "H8"
    assert s["layout"]["yaxis"]["scaleanchor"] == "x"


def test_mosaic_hover_names_layer_head_and_tokens():
    images = causal(3, heads=2)[None].repeat(2, axis=0)  # (2 layers, 2 heads, 3, 3)
    labels = F.token_labels(list("a<c"))
    fig = F.model_mosaic(images, kv_heads=[0, 0], q_labels=labels, k_labels=labels, layers_across=False)
    heat = spec(fig)["data"][0]
    assert heat["y"][1] == "layer 0 · query (1) &lt;"
    assert heat["x"][0] == "head 0 · kv 0 · key (0) a"


def test_metric_heatmap_puts_layers_across():
    v = np.arange(12.0).reshape(4, 3)  # (layer, head)
    s = spec(F.metric_heatmap(v, "entropy"))
    heat = s["data"][0]
    z = np.asarray(F.metric_heatmap(v, "entropy").data[0].z, dtype=np.float64)
    np.testing.assert_array_equal(z, v.T)  # (head, layer): z[h, l] is layer l's head h
    assert heat["x"] == [f"layer {i}" for i in range(4)] and heat["y"] == ["head 0", "head 1", "head 2"]


def test_metric_panels_draw_every_statistic_in_one_figure_on_its_own_axes():
    """Several statistics in one chart (issue 40: one chart per statistic cost Plotly's fixed cost
    each): one heatmap per statistic on its own subplot, z[h, l] = layer l's head h exactly, each
    titled, hovered and coloured on its own range."""
    rng = np.random.default_rng(0)
    a, b, c = rng.random((4, 3)), rng.random((4, 3)) * 9, rng.random((4, 1))
    fig = F.metric_panels(
        [F.MetricPanel(a, "entropy", zmin=0, zmax=1), F.MetricPanel(b, "distance"),
         F.MetricPanel(c, "GQA coherence", head_names=["kv 0"])],
        kv_heads=[0, 0, 0],
    )  # fmt: skip
    s = spec(fig)
    assert [t["type"] for t in s["data"]] == ["heatmap"] * 3
    for trace, want in zip(fig.data, (a, b, c), strict=True):
        np.testing.assert_array_equal(np.asarray(trace.z, dtype=np.float64), want.T)
    assert [t["xaxis"] for t in s["data"]] == ["x", "x2", "x3"]  # each on its own axes
    assert s["data"][0]["zmax"] == 1 and "zmax" not in s["data"][1]
    assert s["data"][1]["hovertemplate"] == "%{x} · %{y}<br>distance %{z:.3f}<extra></extra>"
    assert s["data"][2]["y"] == ["kv 0"] and s["layout"]["yaxis3"]["ticktext"] == ["KV0"]
    assert [t["text"] for t in s["layout"]["annotations"]] == ["entropy", "distance", "GQA coherence"]
    bars = [t["colorbar"]["x"] for t in s["data"]]
    assert bars[0] < s["layout"]["xaxis2"]["domain"][0] < bars[1]  # beside its own panel


def test_diverging_grid_is_centred_on_zero():
    d = causal(4, heads=2) - causal(4, heads=2, seed=1)
    s = spec(F.head_grid(d, F.token_labels(list("abcd")), diverging=True))
    axis = s["layout"]["coloraxis"]
    assert axis["cmid"] == 0 and axis["cmin"] == -axis["cmax"]


def test_matrix_heatmap_shows_masked_scores_as_gaps():
    a = np.array([[1.0, -np.inf], [0.5, -2.0]], dtype=np.float32)
    fig = F.matrix_heatmap(a, row_labels=["(0) a", "(1) b"], col_labels=["(0) a", "(1) b"])
    z = np.asarray(fig.data[0].z, dtype=float)
    assert np.isnan(z[0, 1]) and z[1, 1] == -2.0
    assert fig.data[0].zmid == 0


def test_rows_heatmap_pools_long_key_axes():
    rows = np.random.default_rng(0).random((9, 5000), dtype=np.float32)
    fig = F.rows_heatmap(rows, [f"head {h}" for h in range(9)], F.token_labels(["k"] * 5000))
    assert np.asarray(fig.data[0].z).shape == (9, F.SINGLE_MAX_KEYS)


def test_figure_name_is_a_safe_file_stem():
    assert F.figure_name("smollm2-135m", "L3", "H0") == "attnviz_smollm2-135m_L3_H0"
    name = F.figure_name("meta-llama/Llama 3", "", "L1")
    assert "/" not in name and " " not in name and name.startswith("attnviz_meta-llama-Llama-3")


def test_grid_side_keeps_short_texts_unpooled():
    assert F.grid_side(9) == 115
    assert F.grid_side(9, n_tokens=128) == 128  # 9 x 128^2 cells: within twice the budget
    assert F.grid_side(9, n_tokens=129) == 115
    assert F.grid_side(32, n_tokens=128) == F.grid_side(32) < 128


def axis_ticks(axis: dict) -> list[str]:
    """The tick labels an axis spec asks for (every one, or [] when Plotly chooses)."""
    return list(axis.get("ticktext") or []) if axis.get("tickmode") == "array" else []


def test_short_token_axes_label_every_token_and_long_ones_are_thinned():
    labels = F.token_labels([f"w{i}" for i in range(8)])
    head = spec(F.head_heatmap(causal(8)[0], labels))["layout"]
    assert axis_ticks(head["xaxis"]) == axis_ticks(head["yaxis"]) == labels
    grid = spec(F.head_grid(causal(8, heads=4), labels))["layout"]
    for name in ("xaxis", "yaxis", "xaxis4", "yaxis4"):
        assert axis_ticks(grid[name]) == labels, name
    rows = spec(F.rows_heatmap(causal(8, heads=3)[:, -1], ["h0", "h1", "h2"], labels))["layout"]
    assert axis_ticks(rows["xaxis"]) == labels
    long = F.token_labels([f"w{i}" for i in range(F.ALL_TICKS_MAX + 1)])
    fig = spec(F.head_heatmap(causal(len(long))[0], long))
    assert axis_ticks(fig["layout"]["xaxis"]) == [] and fig["data"][0]["x"] == long  # hover keeps all


def test_titles_sit_under_the_mode_bar():
    layout = spec(F.head_heatmap(causal(3)[0], F.token_labels(list("abc")), title="m · layer 0"))["layout"]
    assert layout["title"]["yref"] == "paper" and layout["title"]["yanchor"] == "bottom"
    assert layout["margin"]["t"] >= 70  # the mode bar (~30 px) above the title


def test_metric_heatmap_labels_every_second_layer_horizontally():
    layout = spec(F.metric_heatmap(np.random.default_rng(0).random((30, 9)), "entropy"))["layout"]
    assert layout["xaxis"]["tickangle"] == 0
    assert layout["xaxis"]["ticktext"] == [str(i) for i in range(0, 30, 2)]
    small = spec(F.metric_heatmap(np.zeros((6, 4)), "sink"))["layout"]
    assert small["xaxis"]["ticktext"] == [str(i) for i in range(6)]


def test_matrix_heatmap_rotates_token_labels():
    labels = F.token_labels(["the", "financial", "bank"])
    layout = spec(F.matrix_heatmap(causal(3)[0], row_labels=labels, col_labels=labels))["layout"]
    assert layout["xaxis"]["tickangle"] == -60 and axis_ticks(layout["xaxis"]) == labels
    dims = spec(F.matrix_heatmap(np.ones((3, 8)), row_labels=labels, col_labels=[f"d{j}" for j in range(8)]))
    assert "tickangle" not in dims["layout"]["xaxis"]


@pytest.mark.parametrize("across", [True, False])
def test_every_mosaic_tile_marker_sits_on_its_own_layer_and_head(across):
    """A click on a thumbnail opens the (layer, head) drawn under it: each marker's click data,
    its hover name and the tile at its position are one (layer, head). Caught: the click data
    written [head, layer]."""
    n_l, n_h, side = 3, 4, 2
    images = np.zeros((n_l, n_h, side, side), dtype=np.float32)
    for la in range(n_l):
        for h in range(n_h):
            images[la, h] = (10 * la + h + 1) / 100  # a value of its own per tile
    fig = F.model_mosaic(images, pickable=True, layers_across=across, scale="linear")
    heat = fig.data[0]
    tiles = next(t for t in fig.data if t.name == "tiles")
    z = np.asarray(heat.z, dtype=float)
    for (la, h), x, y, text in zip(tiles.customdata, tiles.x, tiles.y, tiles.text, strict=True):
        assert text == f"layer {la} · head {h}"
        assert z[list(heat.y).index(y), list(heat.x).index(x)] == np.float32((10 * la + h + 1) / 100)


def test_mosaic_panels_run_layers_across_with_each_tile_as_drawn():
    """The mosaic as panels for the browser element: head h of layer l is panel h * layers + l,
    titled "L{l} H{h}" (a hybrid's block index for L), its values the tile on the chosen scale
    (float32: the hover's exact value)."""
    rng = np.random.default_rng(0)
    images = rng.random((3, 2, 4, 4)).astype(np.float32)  # (layers, heads, s_q, s_k)
    labels = [f"t{i}" for i in range(4)]
    panels = F.mosaic_panels(
        images, q_labels=labels, k_labels=labels, layer_names=["layer 0", "layer 5", "layer 7"]
    )
    assert [p.title for p in panels] == ["L0 H0", "L5 H0", "L7 H0", "L0 H1", "L5 H1", "L7 H1"]
    np.testing.assert_array_equal(panels[4].z, images[1, 1])
    logged = F.mosaic_panels(images, q_labels=labels, k_labels=labels, scale="log", kv_heads=[0, 0])
    assert logged[1].title == "L1 H0 kv0" and logged[1].z.dtype == np.float32
    np.testing.assert_allclose(logged[1].z, np.log10(images[1, 0]), rtol=1e-6)
