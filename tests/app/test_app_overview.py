"""Model overview page through AppTest: every head at once, head statistics, head finder."""

from __future__ import annotations

import numpy as np
from apptest import TEXT, TINY, heatmaps, mounted, new_app, ok, specs, z_of

import attnviz
from attnviz import metrics

PAGE = "pages/1_Model_overview.py"


def tiny_metrics(text: str = TEXT):
    import tiny

    return metrics.head_metrics(attnviz.extract(tiny.loaded("llama-gqa"), text))


def test_mosaic_statistics_and_finder(env):
    at = new_app(PAGE, model=TINY, text=TEXT).run()
    ok(at)
    # the mosaic: one heatmaps element (ui.heatmaps), a panel per head, layers across (3 columns)
    # and heads down (4 rows) on every model, each tile titled by its layer and head
    (mosaic,) = mounted(at, "attnviz_heatmaps")
    assert mosaic["cols"] == 3 and mosaic["click"] == "panel" and mosaic["preview"]
    titles = [p["title"] for p in mosaic["panels"]]
    assert titles == [f"L{la} H{h} kv{h // 2}" for h in range(4) for la in range(3)]
    assert mosaic["col_titles"] == ["0", "1", "2"]  # layers; the tiles' own titles in the hover
    assert mosaic["row_titles"] == [f"H{h} kv{h // 2}" for h in range(4)]
    titles = [t["name"] for t in heatmaps(statistics(at))]
    for name in ("entropy", "sink", "previous token", "induction", "GQA coherence"):
        assert any(name in t for t in titles), (name, titles)
    table = at.dataframe[0].value
    assert len(table) == 3 * 4 and list(table.columns[:3]) == ["layer", "head", "kv head"]
    want = tiny_metrics().entropy
    assert np.all(np.diff(table["entropy"].to_numpy()) <= 1e-9)  # sorted by entropy, highest first
    assert table["entropy"].iloc[0] == round(float(want.max()), 4)
    assert table["open"].iloc[0].startswith("./?model=tiny%3Allama-gqa&text=")


def statistics(at) -> dict:
    """The head statistics' one chart (`attnviz.figures.metric_panels`: a heatmap per statistic)."""
    found = [c for c in specs(at) if any("entropy" in t.get("name", "") for t in heatmaps(c))]
    assert len(found) == 1, len(found)
    return found[0]


def test_entropy_heatmap_holds_the_engine_numbers(env):
    at = new_app(PAGE, model=TINY, text=TEXT).run()
    entropy = next(t for t in heatmaps(statistics(at)) if "entropy" in t["name"])
    np.testing.assert_allclose(z_of(entropy), tiny_metrics().entropy.T, atol=1e-6)


def test_the_statistics_are_one_chart_with_every_statistic_exact(env):
    """Issue 40: seven metric heatmaps were seven charts (Plotly's fixed cost each, twice on a
    Streamlit mount). They are one chart, one heatmap subplot per statistic, each holding the
    engine's values and naming them in its hover; the page draws 4 charts in all (the mosaic, the
    statistics, and the short text's rollout strip and flow map)."""
    from ui.head_stats import METRIC_NAMES

    at = new_app(PAGE, model=TINY, text=TEXT).run()
    ok(at)
    hm = tiny_metrics()  # the text's statistics (the page adds the induction probe's)
    traces = {t["name"]: t for t in heatmaps(statistics(at))}
    assert len(traces) == len(hm.metrics) + 1 and METRIC_NAMES["induction"] in traces
    for m in hm.metrics:
        trace = traces[METRIC_NAMES.get(m, m)]
        want = hm.kv_coherence() if m == "gqa_coherence" else hm.values(m)
        # float32 statistics: from the page's own forward vs a second extract, within 1e-6
        np.testing.assert_allclose(z_of(trace), np.asarray(want, dtype=np.float64).T, atol=1e-6)
        assert "%{z:.3f}" in trace["hovertemplate"] and "%{x} · %{y}" in trace["hovertemplate"]
    charts = [t.get("name", "") for c in specs(at) for t in c["data"][:1]]
    assert len(specs(at)) == 4, charts  # mosaic, statistics, the rollout's strip and flow map


def test_sort_by_another_metric_and_open_a_head_in_the_explorer(env):
    at = new_app(PAGE, model=TINY, text=TEXT).run()
    at.selectbox(key="metric").set_value("sink").run()
    ok(at)
    table = at.dataframe[0].value
    assert np.all(np.diff(table["sink"].to_numpy()) <= 1e-9)
    assert at.query_params["metric"] == "sink"
    # pick the third row of the table, then open it
    at.session_state["head_table"] = {"selection": {"rows": [2], "columns": []}}
    at.run()
    layer, head = int(table["layer"].iloc[2]), int(table["head"].iloc[2])
    at.button(key="open_head").click().run()
    ok(at)
    assert at.title[0].value == "Attention explorer"
    assert at.slider(key="layer").value == layer and at.selectbox(key="head").value == head
    assert at.query_params["layer"] == str(layer) and at.query_params["head"] == str(head)


def test_metric_link_param_and_encoder_decoder_stacks(env):
    at = new_app(PAGE, model="tiny:bart", text=TEXT, stack="cross", metric="induction").run()
    assert not at.exception
    assert at.segmented_control(key="stack").value == "cross"
    # induction is a self-attention metric: on cross-attention it is left out, with a note
    assert any("self-attention" in c.value for c in at.caption)
    # the link's metric is a valid name (no "link value not valid" warning), only not available here
    assert not any("`metric`" in w.value for w in at.warning), [w.value for w in at.warning]
    assert any("Metric 'induction' is not available here" in w.value for w in at.warning)
    assert at.selectbox(key="metric").value == "entropy"


LONG_WORDS = "the river bank and the money bank are not the same bank at all " * 30  # > 300 tokens


def log10(w: np.ndarray) -> np.ndarray:
    return np.clip(np.log10(np.maximum(w, 1e-5)), -5, 0)


def test_one_colour_scale_control_auto_by_length_and_old_log_links(env):
    """The overview has the explorer's "Colour scale" (no "Log colour" switch, no "per head":
    one mosaic, one range); auto is linear on a short text and log past 300 tokens, said in a
    caption; an old ``log=1`` link opens on log, and the mosaic then holds log10 of the engine's
    weights (each tile one head, the tiny text unpooled)."""
    from ui.params import OverviewParams

    at = new_app(PAGE, model=TINY, text=TEXT, induction=0).run()
    ok(at)
    assert [t.key for t in at.toggle if "colour" in t.label.lower()] == []
    box = at.selectbox(key="scale")
    assert box.label == "Colour scale" and box.value == "auto"
    assert box.options == ["auto (log₁₀ past 300 tokens)", "linear", "log₁₀", "rank (percentile)"]
    assert specs(at)[0]["layout"]["coloraxis"]["cmin"] == 0  # linear weights
    assert not any("Auto colour scale" in c.value for c in at.caption)
    at = new_app(PAGE, model=TINY, text=LONG_WORDS, induction=0).run()
    ok(at)
    assert specs(at)[0]["layout"]["coloraxis"]["cmin"] == -5  # log10 axis
    assert any("Auto colour scale: colour is log₁₀" in c.value for c in at.caption)
    at = new_app(PAGE, model=TINY, text=TEXT, log=1, induction=0).run()
    ok(at)
    assert at.selectbox(key="scale").value == "log"
    assert at.query_params["scale"] == "log" and "log" not in at.query_params
    import tiny

    res = attnviz.extract(tiny.loaded("llama-gqa"), TEXT)
    tiles = heatmaps(specs(at)[0])  # one panel per head: head h of layer l is panel h * 3 + l
    for layer in range(3):
        for h in range(4):
            tile = z_of(tiles[h * 3 + layer])
            assert tile.shape == (res.n_tokens, res.n_tokens)  # short text: each tile is the head itself
            np.testing.assert_allclose(tile, log10(res.head(layer, h)), atol=1e-5)
    assert OverviewParams.from_query({"log": "1", "scale": "rank"})[0].scale == "rank"
    assert OverviewParams.from_query({"log": "0"})[0].scale == "auto"


def test_a_click_on_a_mosaic_tile_opens_that_head_in_the_explorer(env):
    """The mosaic's tiles are panels of one element (ui.heatmaps), head h of layer l at panel
    h * layers + l: a click on panel 7 of 3 layers x 4 heads opens layer 1, head 2. Its hover
    values are the tile as drawn, float32 of the engine's weights."""
    at = new_app(PAGE, model=TINY, text=TEXT, induction=0).run()
    ok(at)
    (mosaic,) = mounted(at, "attnviz_heatmaps")
    tiles = heatmaps(specs(at)[0])
    import tiny

    res = attnviz.extract(tiny.loaded("llama-gqa"), TEXT, statistics=True)  # the page's own run
    np.testing.assert_array_equal(z_of(tiles[7]), res.head(1, 2).astype(np.float32))  # exact, as drawn
    assert mosaic["panels"][7]["title"] == "L1 H2 kv1"
    at.session_state["mosaic_tiles"] = {"click": {"panel": 7, "n": 1}}  # what the element sends
    at.run()
    ok(at)
    assert at.title[0].value == "Attention explorer"
    assert at.slider(key="layer").value == 1 and at.selectbox(key="head").value == 2
