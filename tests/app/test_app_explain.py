"""The Explain page through AppTest on a tiny model: every view draws from one cached trace, the
URL carries the view, a clicked edge or ranked head opens in the explorer, refusals say why."""

from __future__ import annotations

import pytest
from apptest import TEXT, TINY, new_app, ok, prepare, specs

PAGE = "pages/6_Explain.py"


@pytest.fixture
def env(monkeypatch):
    return prepare(monkeypatch)


def titles(at) -> list[str]:
    return [(s["layout"].get("title") or {}).get("text", "") for s in specs(at)]


def test_every_view_draws_and_the_link_carries_it(env):
    at = new_app(PAGE, model=TINY, text=TEXT).run()
    ok(at)
    assert any(t.startswith("Routes to the prediction") for t in titles(at))
    assert at.query_params["view"] == "routes"
    for view, title in (
        ("logit lens", "Logit lens"),
        ("attribution", "Direct logit attribution"),
        ("ablation", ""),
    ):
        at.segmented_control(key="view").set_value(view).run()
        ok(at)
        assert at.query_params["view"] == view
        if title:
            assert any(t.startswith(title) for t in titles(at)), titles(at)
    at.multiselect(key="abl_pick").set_value(["1.2", "0.0"]).run()
    ok(at)
    assert any(t.startswith("Next token at") for t in titles(at))
    assert at.query_params["abl"] == "1.2,0.0"
    labels = [m.label for m in at.metric]
    assert labels[0].startswith("p(") and "KL(before ‖ after)" in labels and len(labels) == 4


def test_a_clicked_edge_opens_its_head_in_the_explorer(env):
    at = new_app(PAGE, model=TINY, text=TEXT, thr="0.01").run()
    ok(at)
    routes = next(
        s for s in specs(at) if (s["layout"].get("title") or {}).get("text", "").startswith("Routes")
    )
    handles = next(t for t in routes["data"] if t.get("customdata"))
    layer, head, src, dst = handles["customdata"][0]
    at.session_state["routes_chart"] = {
        "selection": {"points": [{"customdata": [layer, head, src, dst]}], "point_indices": [0]}
    }
    at.run()
    ok(at)
    button = at.button(key="routes_open")
    assert f"layer {layer}, head {head}" in button.label
    button.click().run()
    ok(at)
    assert at.query_params["layer"] == str(layer) and at.query_params["head"] == str(head)
    assert at.query_params["tok"] == str(dst)


def test_an_encoder_is_refused_with_the_reason(env):
    at = new_app(PAGE, model="tiny:bert", text=TEXT).run()
    assert not at.exception
    assert any("encoder" in e.value for e in at.error), [e.value for e in at.error]


def test_from_scratch_shows_the_rotary_bands_of_the_chosen_query_and_key(env):
    at = new_app("pages/2_From_scratch.py", model=TINY, text=TEXT, layer=1, head=2, rq=4, rk=1).run()
    ok(at)
    rot = next(
        s for s in specs(at) if (s["layout"].get("title") or {}).get("text", "").startswith("Rotary bands")
    )
    title = rot["layout"]["title"]["text"]
    assert "layer 1 head 2 · query 4, key 1" in title
    terms = next(t for t in rot["data"] if t.get("name") == "term")
    score = float(title.split("score ")[1].split(" ")[0])
    assert sum(terms["y"]) == pytest.approx(score, abs=2e-3)  # the bands add up to the score shown
    assert at.query_params["rq"] == "4" and at.query_params["rk"] == "1"
    at2 = new_app("pages/2_From_scratch.py", model="tiny:gpt2", text=TEXT).run()
    ok(at2)
    assert any("no rotary embedding" in i.value for i in at2.info)


def test_a_cancelled_trace_keeps_nothing_and_runs_again_on_request(env):
    """The trace runs behind a progress bar with a Cancel button; a cancelled run says so, draws
    nothing, and "Run again" runs it."""
    from ui import explain

    at = new_app(PAGE, model=TINY, text=TEXT)
    key = ("explain_trace", "tiny-llama-gqa", "", TEXT, False)
    at.session_state[explain._CANCELLED] = repr(key)
    at.run()
    assert not at.exception
    assert any("Cancelled" in i.value for i in at.info), [i.value for i in at.info]
    assert not specs(at)
    at.button(key="explain_rerun").click().run()
    ok(at)
    assert any(t.startswith("Routes to the prediction") for t in titles(at))
