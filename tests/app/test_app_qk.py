"""The Explain page's "why this head attends" view through AppTest on a tiny model: the link opens
it with its head, query and key; it shows the split, the largest terms in words and the query
row; a clicked head part opens in the explorer; the explorer's big head links to it."""

from __future__ import annotations

import numpy as np
import pytest
from apptest import TEXT, TINY, new_app, ok, prepare, specs, z_of

import attnviz

PAGE = "pages/6_Explain.py"
VIEW = "why this head attends"


@pytest.fixture
def env(monkeypatch):
    return prepare(monkeypatch)


def _figure(at) -> dict:
    return next(s for s in specs(at) if (s["layout"].get("title") or {}).get("text", "").startswith("Why L"))


def test_the_link_opens_the_split_of_one_score(env):
    at = new_app(PAGE, model=TINY, text=TEXT, view=VIEW, wl="2", wh="3", pos="5", wk="1").run()
    ok(at)
    fig = _figure(at)
    title = fig["layout"]["title"]["text"]
    assert title.startswith("Why L2H3 attends from (5)") and "to (1)" in title
    heat = next(t for t in fig["data"] if t["type"] == "heatmap")
    parts = heat["x"]
    assert parts[0] == "embed" and parts[-1] == "bias" and "L1H2" in parts and "L1.mlp" in parts
    assert heat["zmid"] == 0  # diverging, centred at 0
    # the figure's cells are the engine's terms, and they add up to the score in the title
    lm = attnviz.wrap_model(*_tiny())
    cell = attnviz.qk_attribution(lm, TEXT, layer=2, head=3, query=5, key=1)
    np.testing.assert_allclose(z_of(heat), cell.terms, rtol=1e-5, atol=1e-6)
    assert f"score {cell.score:.4g}" in title
    words = [m.value.replace("\\", "") for m in at.markdown if "\\(query\\) with" in m.value]
    assert len(words) == 1 and words[0].count("(query) with") == 10 and "of " in words[0]
    assert at.query_params["wl"] == "2" and at.query_params["wh"] == "3" and at.query_params["wk"] == "1"
    at.segmented_control(key="wby").set_value("layer").run()
    ok(at)
    assert _figure(at)["data"][0]["x"] == ["embed", "L0", "L1", "bias"]
    assert at.query_params["wby"] == "layer"


def _tiny():
    import tiny

    return tiny.model("llama-gqa"), tiny.tokenizer("decoder")


def test_a_clicked_head_part_opens_in_the_explorer(env):
    at = new_app(PAGE, model=TINY, text=TEXT, view=VIEW, wl="2", wh="0", pos="-1").run()
    ok(at)
    at.session_state["qk_chart"] = {"selection": {"points": [{"customdata": [1, 2]}], "point_indices": [0]}}
    at.run()
    ok(at)
    button = at.button(key="qk_open")
    assert "layer 1, head 2" in button.label
    button.click().run()
    ok(at)
    assert at.query_params["layer"] == "1" and at.query_params["head"] == "2"


def test_the_query_row_lists_every_key(env):
    at = new_app(PAGE, model=TINY, text=TEXT, view=VIEW, wl="1", wh="1", pos="4").run()
    ok(at)
    at.toggle(key="qk_row_on").set_value(True).run()
    ok(at)
    table = at.dataframe[-1].value
    assert len(table) == 5 and list(table.columns)[:3] == ["key", "score", "part 1"]


def test_a_masked_key_is_refused_with_the_reason(env):
    at = new_app(
        PAGE, model="tiny:mistral-sliding", text=TEXT, view=VIEW, wl="1", wh="0", pos="-1", wk="0"
    ).run()
    assert not at.exception
    assert any("does not see key 0" in e.value for e in at.error)


def test_the_explorers_big_head_links_a_clicked_cell_here(env):
    at = new_app(model=TINY, text=TEXT, layer="2", head="1").run()
    ok(at)
    assert any("Click a cell of the head" in c.value for c in at.caption)
    at.session_state["big_head"] = {"click": {"panel": 0, "row": 5, "col": 1, "n": 1}}  # query 5, key 1
    at.run()
    ok(at)
    links = [e.proto for e in at.get("page_link")]
    why = next(link for link in links if link.label.startswith("Why does head 1"))
    assert "attend from 5 to 1" in why.label
    for part in ("view=why", "wl=2", "wh=1", "pos=5", "wk=1"):
        assert part in why.query_string or part.replace(" ", "+") in why.query_string, (part, why)


def test_qk_space_and_the_ov_map(env):
    at = new_app(PAGE, model=TINY, text=TEXT, view=VIEW, wl="1", wh="2", pos="-1").run()
    at.toggle(key="qk_space_on").set_value(True).run()
    ok(at)
    scatter = next(s for s in specs(at) if "queries and keys over the text" in s["layout"]["title"]["text"])
    names = [t["name"] for t in scatter["data"]]
    assert names == ["queries", "keys (after RoPE)", "keys (before RoPE)"]
    assert all(len(t["customdata"]) == 8 for t in scatter["data"])  # one point per token
    at.session_state["qk_space_chart_0"] = {
        "selection": {"points": [{"customdata": [3]}], "point_indices": [0]}
    }
    at.run()
    ok(at)
    assert at.query_params["pos"] == "3"  # the clicked token is the query now
    at.toggle(key="qk_ov_on").set_value(True).run()
    ok(at)
    ov = next(s for s in specs(at) if s["layout"]["title"]["text"].startswith("OV circuits"))
    heat = ov["data"][0]
    lm = attnviz.wrap_model(*_tiny())
    np.testing.assert_allclose(z_of(heat), attnviz.explain.ov_circuits(lm).copying, atol=1e-6)
    assert heat["customdata"][2][1][:2] == [2, 1]  # (layer, head) of each cell
    tables = [d.value for d in at.dataframe]
    assert any("Copies most" in t.columns for t in tables)
