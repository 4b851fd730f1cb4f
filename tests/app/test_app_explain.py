"""The Explain page through AppTest on a tiny model: every view draws from one cached trace, the
URL carries the view, a clicked edge or ranked head opens in the explorer, refusals say why."""

from __future__ import annotations

import html

import numpy as np
import pytest
from apptest import TEXT, TINY, new_app, ok, open_clicked_head, prepare, specs, z_of

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
    # the button says what the edge's hover says: source → target, as tokens
    hover = handles["hovertext"][0]
    words = hover.split(" attention · ")[1].split("<br>")[0]
    assert html.unescape(words) in button.label.replace("\\", "") and "→" in words, (words, button.label)
    at.slider(key="thr").set_value(0.3).run()  # another graph: the picked edge is not offered
    ok(at)
    assert "routes_open" not in [b.key for b in at.button]
    at.slider(key="thr").set_value(0.01).run()
    button = at.button(key="routes_open")
    button.click().run()
    ok(at)
    assert at.query_params["layer"] == str(layer) and at.query_params["head"] == str(head)
    assert at.query_params["tok"] == str(dst)


def test_an_encoder_is_refused_with_the_reason(env):
    """The reason, and no "Running…" bar left under it whose Cancel would replace the reason."""
    at = new_app(PAGE, model="tiny:bert", text=TEXT).run()
    assert not at.exception
    assert any("encoder" in e.value for e in at.error), [e.value for e in at.error]
    assert not at.get("progress") and not [b for b in at.button if b.label == "Cancel"]


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
    from ui import progress

    key = ("explain_trace", "tiny-llama-gqa", "", TEXT, False)
    env.setattr(progress, "_key", lambda run_key: "this-run" if run_key == key else repr(run_key))
    at = new_app(PAGE, model=TINY, text=TEXT)
    at.session_state["_attnviz_cancelled"] = "this-run"  # ui.progress: the run a Cancel click stopped
    at.run()
    assert not at.exception
    assert any("Cancelled" in i.value for i in at.info), [i.value for i in at.info]
    assert not specs(at)
    next(b for b in at.button if b.label == "Run again").click().run()
    ok(at)
    assert any(t.startswith("Routes to the prediction") for t in titles(at))


def test_a_clicked_attribution_head_opens_in_the_explorer(env):
    """A click on a head of the DLA chart (a cell of the layers × heads map) offers that head with
    its share of the logit; the button opens it in the explorer at the explained position."""
    at = new_app(PAGE, model=TINY, text=TEXT, view="attribution", pos=3).run()
    ok(at)
    dla = next(s for s in specs(at) if "Direct logit attribution" in (s["layout"].get("title") or {})["text"])
    z = z_of(next(t for t in dla["data"] if t.get("type") == "heatmap"))
    layer, head = (int(x) for x in np.unravel_index(np.abs(z).argmax(), z.shape))
    label = open_clicked_head(at, "dla_chart", "dla_open", layer, head)
    assert f"layer {layer}, head {head} ({z[layer, head]:+.3f})" in label, label
    assert at.query_params["tok"] == "3"


def test_a_share_link_opens_every_setting(env):
    """The link's threshold, position, lens size, top k, target token and ablation mode are what
    the page draws with (one parameters object read from the URL)."""
    at = new_app(PAGE, model=TINY, text=TEXT, thr="0.02", pos=2).run()
    ok(at)
    assert any(t.startswith("Routes to the prediction at (2)") and "threshold 0.02" in t for t in titles(at))
    at = new_app(PAGE, model=TINY, text=TEXT, view="logit lens", lpos=3, k=2).run()
    ok(at)
    lens = next(s for s in specs(at) if "Logit lens" in (s["layout"].get("title") or {})["text"])
    assert len(lens["layout"]["xaxis"]["tickvals"]) == 3
    assert lens["data"][0]["customdata"][0][0].count("<br>") == 2  # top 2 + the prediction's line
    at = new_app(PAGE, model=TINY, text=TEXT, view="ablation", abl="1.2", amode="mean").run()
    ok(at)
    ablated = next(s for s in specs(at) if "without L1 H2" in (s["layout"].get("title") or {})["text"])
    assert [t["name"] for t in ablated["data"]] == ["before", "mean-ablated"]  # the rerun replaced by means
    assert at.segmented_control(key="amode").value == "mean"
    assert at.query_params["amode"] == "mean"


def test_ablation_shows_direct_beside_total_effect_and_the_attribution(env):
    """Zero-ablating a head: its direct effect is minus its direct attribution, shown side by side
    with the total effect of the rerun."""
    at = new_app(PAGE, model=TINY, text=TEXT, view="ablation", abl="1.2").run()
    ok(at)
    table = at.dataframe[0].value
    assert list(table["head"]) == ["L1 H2"]
    attribution = float(table["direct attribution"][0])
    assert abs(attribution) > 1e-4
    assert float(table["direct effect of the zero ablation"][0]) == pytest.approx(-attribution, abs=2e-4)
    metrics = {m.label: m for m in at.metric}
    assert float(metrics["direct effect"].value) == pytest.approx(-attribution, abs=2e-3)
    total = next(m for label, m in metrics.items() if label.endswith("total effect"))
    assert float(total.value) != 0.0  # the rerun moved the logit
    before, after = (float(x) for x in total.delta.split(" → "))
    # the big number is the effect, the logits its note (caught: it showed the new logit, 20.289)
    assert float(total.value) == pytest.approx(after - before, abs=2e-3)
    at.text_input(key="target").set_value("river").run()  # another token's logit, same heads
    ok(at)
    assert any(m.label == "p(“river”)" for m in at.metric), [m.label for m in at.metric]
    assert list(at.dataframe[0].value["head"]) == ["L1 H2"]


def test_a_post_norm_model_says_its_norm_is_frozen(env):
    """Gemma 2 puts a norm between the heads and the stream: the routes and attribution views say
    its per-token scale is frozen and the parts still add up exactly."""
    at = new_app(PAGE, model="tiny:gemma2", text=TEXT, thr="0.02").run()
    ok(at)
    assert any("frozen at its actual value" in c.value for c in at.caption), [c.value for c in at.caption]
    at.segmented_control(key="view").set_value("attribution").run()
    ok(at)
    assert any("frozen at its actual value" in c.value for c in at.caption), [c.value for c in at.caption]
    at = new_app(PAGE, model=TINY, text=TEXT).run()
    ok(at)
    assert not any("frozen at its actual value" in c.value for c in at.caption)


def test_a_long_text_picks_the_position_by_number(env):
    """Past 512 tokens the position is a number input (a selectbox would send every token), read
    from the link like the short one."""
    long_text = " ".join([TEXT] * 150)
    at = new_app(PAGE, model=TINY, text=long_text, pos=600).run()
    ok(at)
    assert "pos" not in [s.key for s in at.selectbox] and at.number_input(key="pos").value == 600
    assert any(t.startswith("Routes to the prediction at (600)") for t in titles(at)), titles(at)
    assert any(c.value.startswith("Position 600:") for c in at.caption)


def test_one_trace_serves_every_view_even_when_it_is_large(env):
    """Switching views and options never reruns the model: a trace the size of a long text's
    (300 MB, past the shared derived-values budget) is kept in a cache of its own, not pushed out
    by the graph drawn from it."""
    import attnviz.explain as X

    calls = []
    real = X.trace

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    env.setattr(X, "trace", counted)
    env.setattr(X.Trace, "nbytes", property(lambda _self: 300 * 2**20))
    at = new_app(PAGE, model=TINY, text=TEXT).run()
    ok(at)
    at.slider(key="thr").set_value(0.02).run()
    for view in ("logit lens", "attribution", "routes"):
        at.segmented_control(key="view").set_value(view).run()
        ok(at)
    assert len(calls) == 1


def test_a_clicked_node_shows_the_tokens_its_block_promotes_and_suppresses(env):
    """LLM-TT's node inspection: a node of the routes graph is the output of the block below it;
    a click lists what that block writes there, projected on the vocabulary, labelled exactly."""
    at = new_app(PAGE, model=TINY, text=TEXT, thr="0.01").run()
    ok(at)
    routes = next(
        s for s in specs(at) if (s["layout"].get("title") or {}).get("text", "").startswith("Routes")
    )
    nodes = next(t for t in routes["data"] if t.get("name") == "node (click)")
    ffn = next(d for d in nodes["customdata"] if d[4] == "ffn")
    assert "FFN output" in nodes["hovertext"][nodes["customdata"].index(ffn)]
    at.session_state["routes_chart"] = {"selection": {"points": [{"customdata": ffn}], "point_indices": [0]}}
    at.run()
    ok(at)
    frames = {d.value.columns[0]: d.value for d in at.dataframe}
    promoted, suppressed = frames["Promoted"], frames["Suppressed"]
    assert len(promoted) == len(suppressed) == 10
    assert promoted["Δlogit"].iloc[0] > 0 > suppressed["Δlogit"].iloc[0]
    assert any("direct effect on the logits at this token" in c.value for c in at.caption)
    assert any(f"What layer {ffn[0]} FFN writes" in m.value for m in at.markdown)
    assert "routes_open" not in [b.key for b in at.button]  # a block is no head to open
