"""Model overview page through AppTest: every head at once, head statistics, head finder."""

from __future__ import annotations

import numpy as np
import pytest
from test_app_explorer import TEXT, TINY, heatmaps, new_app, ok, prepare, specs, z_of

import attnviz
from attnviz import metrics

PAGE = "pages/1_Model_overview.py"


@pytest.fixture
def env(monkeypatch):
    return prepare(monkeypatch)


def tiny_metrics(text: str = TEXT):
    import tiny

    return metrics.head_metrics(attnviz.extract(tiny.loaded("llama-gqa"), text))


def test_mosaic_statistics_and_finder(env):
    at = new_app(PAGE, model=TINY, text=TEXT).run()
    ok(at)
    charts = specs(at)
    mosaic = charts[0]
    assert len(heatmaps(mosaic)) == 1
    # 3 layers x 4 heads: 4 head rows > 3 layers, so layers are the rows here
    assert mosaic["layout"]["yaxis"]["ticktext"] == ["L0", "L1", "L2"]
    assert mosaic["layout"]["xaxis"]["ticktext"] == ["H0", "H1", "H2", "H3"]
    titles = [(c["layout"].get("title") or {}).get("text", "") for c in charts[1:]]
    for name in ("entropy", "sink", "previous token", "induction", "GQA coherence"):
        assert any(name in t for t in titles), (name, titles)
    table = at.dataframe[0].value
    assert len(table) == 3 * 4 and list(table.columns[:3]) == ["layer", "head", "kv head"]
    want = tiny_metrics().entropy
    assert np.all(np.diff(table["entropy"].to_numpy()) <= 1e-9)  # sorted by entropy, highest first
    assert table["entropy"].iloc[0] == round(float(want.max()), 4)
    assert table["open"].iloc[0].startswith("./?model=tiny%3Allama-gqa&text=")


def test_entropy_heatmap_holds_the_engine_numbers(env):
    at = new_app(PAGE, model=TINY, text=TEXT).run()
    entropy = next(c for c in specs(at) if "entropy" in (c["layout"].get("title") or {}).get("text", ""))
    np.testing.assert_allclose(z_of(heatmaps(entropy)[0]), tiny_metrics().entropy.T, atol=1e-6)


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
