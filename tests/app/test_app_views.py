"""The new views through AppTest: head atlas page, token views, value-weighted toggle, clicks on
the grid and on tokens (selection events set the head / token), the shared colour scale."""

from __future__ import annotations

import numpy as np
import pytest
from apptest import TEXT, TINY, elements, heatmaps, new_app, ok, specs, vals, z_of

import attnviz
from attnviz.analysis import value_weighted as VW

ATLAS = "pages/5_Head_atlas.py"


@pytest.fixture
def env(env, tmp_path):
    """The page environment, converted built-ins cached in a fresh folder."""
    env.setenv("ATTNVIZ_CACHE", str(tmp_path))
    return env


def tiny_result():
    import tiny

    lm = tiny.loaded("llama-gqa")
    return lm, attnviz.extract(lm, TEXT)


def named(spec: dict, name: str) -> dict:
    return next(t for t in spec["data"] if t.get("name") == name)


def grid_of(at) -> dict:
    return next(s for s in specs(at) if len(heatmaps(s)) > 1)


def big_of(at) -> dict:
    return next(s for s in specs(at) if "· head" in (s["layout"].get("title") or {}).get("text", ""))


def test_grid_and_big_view_share_one_colour_scale(env):
    at = new_app(model=TINY, text=TEXT, layer=1, head=2).run()
    ok(at)
    grid, big = grid_of(at), big_of(at)
    _, res = tiny_result()
    layer = res.layer(1)
    assert grid["layout"]["coloraxis"]["cmax"] == pytest.approx(float(layer.max()), rel=1e-6)
    assert big["layout"]["coloraxis"]["cmax"] == grid["layout"]["coloraxis"]["cmax"]
    assert "layer 1 · head 2 " in big["layout"]["title"]["text"] + " "  # the big head names the head
    at.selectbox(key="scale").set_value("perhead").run()
    big = big_of(at)
    assert big["layout"]["coloraxis"]["cmax"] == pytest.approx(float(layer[2].max()), rel=1e-6)


def test_one_colour_control_and_old_links_map_onto_it(env):
    """The explorer has one colour control (auto / linear / log / rank / per head), no separate
    "Log colour" or "Scale per head" switch; links made with those switches open on the scale
    they meant and are written back with ``scale`` only."""
    from ui.params import ExplorerParams

    _, res = tiny_result()
    layer = res.layer(1)
    at = new_app(model=TINY, text=TEXT, layer=1, head=2, log=1).run()
    ok(at)
    assert not [t for t in at.toggle if t.key in ("log", "perhead")]
    assert [c.key for c in [*at.selectbox, *at.segmented_control] if "scale" in c.label.lower()] == ["scale"]
    assert at.selectbox(key="scale").options == [
        "auto (log₁₀ past 300 tokens)", "linear", "log₁₀", "rank (percentile)", "per head"
    ]  # fmt: skip
    assert at.selectbox(key="scale").value == "log"
    logged = np.log10(np.maximum(layer[2], 1e-5))
    np.testing.assert_allclose(z_of(heatmaps(big_of(at))[0]), logged, atol=1e-5)
    assert at.query_params["scale"] == "log" and "log" not in at.query_params
    at = new_app(model=TINY, text=TEXT, layer=1, head=2, perhead="1").run()
    ok(at)
    assert at.selectbox(key="scale").value == "perhead"
    assert big_of(at)["layout"]["coloraxis"]["cmax"] == pytest.approx(float(layer[2].max()), rel=1e-6)
    assert any("Each head on its own colour range" in c.value for c in at.caption)
    # a link with a scale keeps it; a switch that is off changes nothing
    assert ExplorerParams.from_query({"log": "1", "scale": "rank"})[0].scale == "rank"
    assert ExplorerParams.from_query({"log": "0", "perhead": "0"})[0].scale == "auto"
    assert ExplorerParams.from_query({"log": "1", "perhead": "1"})[0].scale == "perhead"
    assert "log" not in ExplorerParams(scale="log").to_query().params


def test_clicking_a_grid_tile_selects_the_head(env):
    at = new_app(model=TINY, text=TEXT, layer=1, head=0).run()
    at.session_state["head_grid"] = {"click": {"panel": 3, "n": 1}}  # what the grid element sends
    at.run()
    ok(at)
    assert at.selectbox(key="head").value == 3
    np.testing.assert_allclose(z_of(heatmaps(big_of(at))[0]), tiny_result()[1].head(1, 3), atol=1e-6)
    assert at.query_params["head"] == "3"


def test_token_views_and_clicking_a_token(env):
    at = new_app(model=TINY, text=TEXT, layer=2, head=1, tok=4).run()
    ok(at)
    _, res = tiny_result()
    lines = next(s for s in specs(at) if any(t.get("name") == "query tokens" for t in s["data"]))
    assert [c[0] for c in named(lines, "query tokens")["customdata"]] == list(range(len(res.tokens)))
    # only the token view on screen is built: the coloured text is not in the page until chosen
    assert not [s for s in specs(at) if s["data"][0].get("type") == "bar"]
    at.segmented_control(key="tview").set_value("text").run()
    ok(at)
    text_fig = next(s for s in specs(at) if (s["data"][0].get("type") == "bar"))
    bar = text_fig["data"][0]
    np.testing.assert_allclose(vals(bar["marker"]["color"]), res.head(2, 1)[4], atol=1e-6)
    click = {"points": [{"customdata": [6, 0.1]}], "point_indices": [6]}
    at.session_state["text_chart_0"] = {"selection": click}
    at.run()
    ok(at)
    assert at.number_input(key="tok").value == 6 and at.query_params["tok"] == "6"
    bar = next(s for s in specs(at) if (s["data"][0].get("type") == "bar"))["data"][0]
    np.testing.assert_allclose(vals(bar["marker"]["color"]), res.head(2, 1)[6], atol=1e-6)


def test_value_weighted_toggle_draws_the_norms(env):
    at = new_app(model=TINY, text=TEXT, layer=1, head=2, vw=1).run()
    ok(at)
    lm, res = tiny_result()
    want = VW.value_weighted(lm, res, 1)
    want = want / VW.key_norms(lm, res, 1).numpy().max()
    np.testing.assert_allclose(z_of(heatmaps(big_of(at))[0]), want[2], atol=1e-6)


def test_long_text_defaults_to_log_and_says_so(env):
    words = "the river bank and the money bank are not the same bank at all " * 30
    at = new_app(model=TINY, text=words).run()
    ok(at)
    big = big_of(at)
    assert big["layout"]["coloraxis"]["cmin"] == -5  # log10 colour axis
    assert any("Auto colour scale" in c.value for c in at.caption)


def test_atlas_page_runs_and_ranks(env):
    at = new_app(ATLAS, model=TINY, ntexts=6).run()
    ok(at)
    at.button(key="atlas_run").click().run()
    ok(at)
    table = at.dataframe[0].value
    assert len(table) == 12 and np.all(np.diff(table["mean"].to_numpy()) <= 1e-9)
    heat = heatmaps(specs(at)[0])[0]
    assert z_of(heat).shape == (4, 3)  # heads x layers
    # a second visit loads from the disk cache without a button
    again = new_app(ATLAS, model=TINY, ntexts=6).run()
    ok(again)
    assert any("disk cache" in c.value for c in again.caption)


def test_from_scratch_opens_on_a_change_and_draws_the_difference(env):
    from attnviz.reference import layer_walkthrough

    at = new_app("pages/2_From_scratch.py", model=TINY, text=TEXT, layer=1, head=2).run()
    ok(at)
    assert at.segmented_control(key="change").value == "no RoPE"  # not "none": the same map twice
    import tiny

    wt = layer_walkthrough(tiny.loaded("llama-gqa"), TEXT, 1)
    want = wt.counterfactuals.no_rope[2] - wt.probs[2]
    diff = next(
        s
        for s in specs(at)
        if [a["text"] for a in s["layout"].get("annotations", [])][:1] == ["no RoPE − real"]
    )
    np.testing.assert_allclose(z_of(heatmaps(diff)[0]), want, atol=1e-6)
    assert np.abs(want).max() > 0.01


def test_generation_samples_with_the_seed_from_the_link(env):
    import tiny

    from attnviz.extract import Sampling

    at = new_app(
        "pages/4_Generation.py", model=TINY, text=TEXT, k=6, sample=1, temp=1.5, topp=1.0, seed=7
    ).run()
    ok(at)
    want = attnviz.extract(tiny.loaded("llama-gqa"), TEXT, generate=6, sampling=Sampling(1.5, 1.0, 7))
    greedy = attnviz.extract(tiny.loaded("llama-gqa"), TEXT, generate=6)
    shown = " ".join(m.value for m in at.markdown)
    new = [d for d, g in zip(want.tokens.display, want.tokens.generated, strict=True) if g]
    assert want.tokens.ids != greedy.tokens.ids
    assert at.query_params["seed"] == "7" and at.toggle(key="sample").value is True
    assert new[0] in shown, (new, shown[:300])  # the continuation shows the sampled tokens


def grid_mark(at) -> int | None:
    """The open head the grid's frame moves to in the browser (`ui.heatmaps.mark`), from its data."""
    marks = elements(at, marks=True)
    return marks[-1]["index"] if marks else None


def test_the_open_head_is_marked_in_the_grid_and_moves_with_a_head_change(env):
    """Issue 40: the tile open large was never marked. The browser side of the grid frames the
    open head; a head change (which reruns only the big head, not the grid) moves it."""
    at = new_app(model=TINY, text=TEXT, layer=1, head=2).run()
    ok(at)
    assert grid_mark(at) == 2
    at.selectbox(key="head").set_value(3).run()
    assert grid_mark(at) == 3


def test_the_summary_is_one_sentence_and_the_details_fold_away(env):
    """Issue 40: a two-line caption, the token table and the reading note pushed the heatmaps to
    ~675 px down the page. One sentence stays; the rest is in one expander."""
    at = new_app(model=TINY, text=TEXT, layer=1, head=2).run()
    ok(at)
    first = at.markdown[0].value
    assert first.startswith("**tiny-llama-gqa** read ") and first.count(". ") == 0 and first.endswith(".")
    details = next(x for x in at.expander if x.label.startswith("Details"))
    assert any("row = query" in c.value for c in details.caption)  # how to read a map, inside
    assert not any("row = query" in c.value for c in at.main.caption if c not in details.caption)
