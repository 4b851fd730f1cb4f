"""Compare page through AppTest: two texts on one model, one text on two models."""

from __future__ import annotations

import numpy as np
from apptest import TEXT, TINY, engine, heatmaps, new_app, ok, specs, titled, z_of

from attnviz.analysis import align

PAGE = "pages/3_Compare.py"
OTHER_TEXT = "the old bank of a river"  # shares "the", "bank", "of", "river" with TEXT


def test_two_texts_rank_the_heads_that_changed_most(env):
    at = new_app(PAGE, model=TINY, text=TEXT, text2=OTHER_TEXT).run()
    ok(at)
    table = at.dataframe[0].value
    assert len(table) == 3 * 4
    change = table["change (TV)"].to_numpy()
    assert np.all(np.diff(change) <= 1e-9) and change[0] > 0  # most changed first
    assert change.min() >= 0 and change.max() <= 1
    top = specs(at)[0]
    assert top["layout"]["title"]["text"].startswith("Top")
    # A, B and A - B grids: one heatmap per head each; the difference is centred on 0
    grids = [s for s in specs(at) if len(heatmaps(s)) == 4]
    assert len(grids) == 3 and grids[2]["layout"]["coloraxis"]["cmid"] == 0


def test_different_lengths_compare_the_aligned_tokens_and_say_so(env):
    at = new_app(PAGE, model=TINY, text=TEXT, text2=TEXT + " bank").run()
    ok(at)
    note = at.info[0].value
    assert "are aligned" in note and "left out" in note
    a = z_of(heatmaps(titled(at, "A"))[0])
    d = z_of(heatmaps(specs(at)[-1])[0])
    # causal rows of a shared prefix are identical: nothing changed
    assert np.allclose(d, 0, atol=1e-6) and a.shape == d.shape
    assert np.allclose(at.dataframe[0].value["change (TV)"].to_numpy(), 0, atol=1e-6)


def test_the_difference_drawn_is_a_minus_b_from_the_engine(env):
    """Different texts: the A − B grid of the chosen layer and the one-head A − B hold the
    engine's A minus B (clearly non-zero), not A − A or B − B."""
    at = new_app(PAGE, model=TINY, text=TEXT, text2=OTHER_TEXT, layer=1, head=2).run()
    ok(at)
    ra, rb = engine(TEXT), engine(OTHER_TEXT)
    al = align.align_tokens(ra.tokens, rb.tokens)
    a, b = align.aligned(ra.layer(1), al.a), align.aligned(rb.layer(1), al.b)
    want = align.aligned_diff(ra.layer(1), rb.layer(1), al)
    assert np.abs(want).max() > 0.05 and len(al) >= 5
    grids = [s for s in specs(at) if len(heatmaps(s)) == 4]
    for h in range(4):
        np.testing.assert_allclose(z_of(heatmaps(grids[0])[h]), a[h], atol=1e-6)
        np.testing.assert_allclose(z_of(heatmaps(grids[1])[h]), b[h], atol=1e-6)
        np.testing.assert_allclose(z_of(heatmaps(grids[2])[h]), want[h], atol=1e-6)
    one = next(
        s for s in specs(at) if [x["text"] for x in s["layout"].get("annotations", [])][:1] == ["A − B"]
    )
    np.testing.assert_allclose(z_of(heatmaps(one)[0]), want[2], atol=1e-6)
    # and the change score of that head is the mean total variation of its rows
    table = at.dataframe[0].value
    row = table[(table["layer"] == 1) & (table["head"] == 2)]
    tv = 0.5 * np.abs(want[2]).sum(-1).mean()
    assert abs(float(row["change (TV)"].iloc[0]) - tv) < 1e-4


def test_shifted_tokens_are_labelled_with_both_positions(env):
    at = new_app(PAGE, model=TINY, text="the bank of the river", text2="the old bank of the river").run()
    ok(at)
    labels = heatmaps(titled(at, "A"))[0]["x"]
    assert labels[0] == "(0) &lt;s&gt;" and any("|" in s.split(")")[0] for s in labels), labels


def test_selecting_a_row_shows_that_head(env):
    at = new_app(PAGE, model=TINY, text=TEXT, text2=OTHER_TEXT).run()
    table = at.dataframe[0].value
    at.session_state["change_table"] = {"selection": {"rows": [3], "columns": []}}
    at.run()
    ok(at)
    layer, head = int(table["layer"].iloc[3]), int(table["head"].iloc[3])
    assert at.slider(key="layer").value == layer and at.selectbox(key="head").value == head
    assert any(f"**Head {head}, layer {layer}**" in m.value for m in at.markdown)


def test_two_models_with_the_same_layout(env):
    at = new_app(PAGE, model=TINY, text=TEXT, cmp="two models", model2="tiny:qwen3").run()
    ok(at)
    assert "same" in at.info[0].value  # same tokenizer: every weight compared one to one
    assert at.query_params["model2"] == "tiny:qwen3"
    assert len(at.dataframe[0].value) == 12


def test_two_models_with_different_layouts_compare_matched_statistics(env):
    at = new_app(PAGE, model=TINY, text=TEXT, cmp="two models", model2="tiny:gemma2").run()
    ok(at)
    assert "matched statistics" in at.info[0].value
    profile = next(s for s in specs(at) if "per layer" in (s["layout"].get("title") or {}).get("text", ""))
    assert [t["name"] for t in profile["data"]] == ["tiny-llama-gqa", "tiny-gemma2"]
    sim = next(s for s in specs(at) if "correlation" in (s["layout"].get("title") or {}).get("text", ""))
    assert z_of(heatmaps(sim)[0]).shape == (4, 3)  # 4 heads x 3 layers of A, each its best r in B
    assert len(at.dataframe[0].value) == 12
    assert at.text_area(key="text").value == TEXT  # the page keeps serving


def test_one_colour_scale_control_auto_by_length_and_log(env):
    """Compare has the explorer's "Colour scale" without "rank" and "per head" (A and B share one
    range): auto is linear on short texts, log past 300 tokens (said in a caption); on log the
    A and B grids hold log10 of the engine's aligned weights."""
    at = new_app(PAGE, model=TINY, text=TEXT, text2=OTHER_TEXT, layer=1).run()
    ok(at)
    box = at.selectbox(key="scale")
    assert box.label == "Colour scale" and box.value == "auto"
    assert box.options == ["auto (log₁₀ past 300 tokens)", "linear", "log₁₀"]
    grids = [s for s in specs(at) if len(heatmaps(s)) == 4]
    assert grids[0]["layout"]["coloraxis"]["cmin"] == 0
    assert grids[0]["layout"]["coloraxis"]["cmax"] == grids[1]["layout"]["coloraxis"]["cmax"]
    box.set_value("log").run()
    ok(at)
    assert at.query_params["scale"] == "log"
    ra, rb = engine(TEXT), engine(OTHER_TEXT)
    al = align.align_tokens(ra.tokens, rb.tokens)
    a, b = align.aligned(ra.layer(1), al.a), align.aligned(rb.layer(1), al.b)
    grids = [s for s in specs(at) if len(heatmaps(s)) == 4]
    for h in range(4):
        np.testing.assert_allclose(z_of(heatmaps(grids[0])[h]), np.log10(np.maximum(a[h], 1e-5)), atol=1e-5)
        np.testing.assert_allclose(z_of(heatmaps(grids[1])[h]), np.log10(np.maximum(b[h], 1e-5)), atol=1e-5)
    long_text = "the river bank and the money bank are not the same bank at all " * 30
    at = new_app(PAGE, model=TINY, text=long_text, text2=long_text + " bank").run()
    ok(at)
    grids = [s for s in specs(at) if len(heatmaps(s)) == 4]
    assert grids[0]["layout"]["coloraxis"]["cmin"] == -5
    assert any("Auto colour scale: colour is log₁₀" in c.value for c in at.caption)
