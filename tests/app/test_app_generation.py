"""Generation page through AppTest: generate k tokens and step through their attention rows."""

from __future__ import annotations

import numpy as np
from apptest import TEXT, TINY, heatmaps, new_app, ok, specs, z_of

import attnviz

PAGE = "pages/4_Generation.py"


def engine(k: int, arch: str = "llama-gqa"):
    import tiny

    return attnviz.extract(tiny.loaded(arch), TEXT, generate=k)


def test_each_step_shows_the_new_tokens_row_per_head(env):
    at = new_app(PAGE, model=TINY, text=TEXT, k=4).run()
    ok(at)
    res = engine(4)
    gen = [i for i, g in enumerate(res.tokens.generated) if g]
    assert len(at.select_slider(key="gstep").options) == len(gen)
    at.select_slider(key="gstep").set_value(3).run()
    ok(at)
    heads = specs(at)[0]
    trace = heatmaps(heads)[0]
    assert trace["y"] == [f"head {h} · kv {h // 2}" for h in range(4)]
    q = gen[2]
    assert len(trace["x"]) == q + 1  # causal: keys up to the new token
    np.testing.assert_allclose(z_of(trace), res.layer(0, rows=slice(q, q + 1))[:, 0, : q + 1], atol=1e-6)
    assert f"query ({q})" in heads["layout"]["title"]["text"]
    assert at.query_params["gstep"] == "3" and at.query_params["k"] == "4"


def test_predicting_position_row_and_layer_means(env):
    at = new_app(PAGE, model=TINY, text=TEXT, k=3, gstep=2, grow="predicting position", layer=1).run()
    ok(at)
    assert len(specs(at)) == 1  # every layer's means only when asked for
    at.toggle(key="glayers").set_value(True).run()
    ok(at)
    res = engine(3)
    q = [i for i, g in enumerate(res.tokens.generated) if g][1] - 1
    trace = heatmaps(specs(at)[0])[0]
    np.testing.assert_allclose(z_of(trace), res.layer(1, rows=slice(q, q + 1))[:, 0, : q + 1], atol=1e-6)
    layers = heatmaps(specs(at)[1])[0]
    assert layers["y"] == ["layer 0", "layer 1", "layer 2"]
    # each row is that layer's row q averaged over its heads, from the engine
    means = np.stack([res.layer(i, rows=slice(q, q + 1))[:, 0, : q + 1].mean(0) for i in range(3)])
    np.testing.assert_allclose(z_of(layers), means, atol=1e-6)
    assert np.abs(means[0] - means[2]).max() > 1e-3  # the layers differ: a wrong layer would show
    assert [b.label for b in at.get("download_button")] == ["⬇ NPZ", "⬇ CSV", "⬇ HTML", "⬇ SVG", "⬇ PDF"]


def test_step_out_of_range_in_a_link_falls_back(env):
    at = new_app(PAGE, model=TINY, text=TEXT, k=2, gstep=9).run()
    assert not at.exception
    assert any("Step 9 is out of range" in w.value for w in at.warning)


def test_encoders_cannot_generate_and_say_so(env):
    at = new_app(PAGE, model="tiny:bert", text=TEXT).run()
    assert not at.exception
    assert "does not generate text" in at.error[0].value


def test_encoder_decoder_generates_on_the_decoder(env):
    at = new_app(PAGE, model="tiny:bart", text=TEXT, k=3).run()
    ok(at)
    assert at.segmented_control(key="stack").options[:2] == ["decoder", "cross"]
    at.segmented_control(key="stack").set_value("cross").run()
    ok(at)
    trace = heatmaps(specs(at)[0])[0]
    assert len(trace["x"]) == engine(3, "bart").n_tokens  # cross: every encoder token is a key


def test_the_text_shows_the_prompt_then_the_tokens_with_the_step_marked(env):
    at = new_app(PAGE, model=TINY, text=TEXT, k=3, gstep=2).run()
    ok(at)
    res = engine(3)
    gen = [res.tokens.display[i] for i, g in enumerate(res.tokens.generated) if g]
    shown = next(m.value for m in at.markdown if "▸" in m.value)
    prompt, tokens = shown.split(" ▸ ")
    assert TEXT in prompt
    assert tokens.split(" ")[1] == f"**`⟦{gen[1]}⟧`**"  # step 2: bracketed and bold, as code
    assert tokens.split(" ")[0] == f"`{gen[0]}`"


def test_continuation_markdown_is_text_never_markup():
    from ui.text import continuation

    out = continuation("see [x](http://e.vil) **b**\n- item", ["`a`", "<i>"], 1)
    assert "](http://" not in out and "**b**" not in out and "\n" not in out  # one paragraph, no list
    assert out.endswith(" ↵ - item ▸ `` `a` `` **`⟦<i>⟧`**")
    assert continuation("x" * 1000, ["y"], 0, max_prompt_chars=10) == "…xxxxxxxxxx ▸ **`⟦y⟧`**"
    assert continuation("1. a", ["b"], 0).startswith("1\\. a") and continuation("- a", [], 0).startswith(
        "\\- a"
    )


def test_one_colour_scale_control_auto_by_length_and_old_log_links(env):
    """Generation has the explorer's "Colour scale" (no "Log colour", no "per head"): auto is
    linear on a short prompt, log past 300 tokens (said in a caption); an old ``log=1`` link
    opens on log and the rows drawn are log10 of the engine's weights."""
    at = new_app(PAGE, model=TINY, text=TEXT, k=2).run()
    ok(at)
    assert [t.key for t in at.toggle if "colour" in t.label.lower()] == []
    box = at.selectbox(key="scale")
    assert box.label == "Colour scale" and box.value == "auto"
    assert box.options == ["auto (log₁₀ past 300 tokens)", "linear", "log₁₀", "rank (percentile)"]
    assert specs(at)[0]["layout"]["coloraxis"]["cmin"] == 0
    long_prompt = "the river bank and the money bank are not the same bank at all " * 30
    at = new_app(PAGE, model=TINY, text=long_prompt, k=1).run()
    ok(at)
    assert specs(at)[0]["layout"]["coloraxis"]["cmin"] == -5
    assert any("Auto colour scale: colour is log₁₀" in c.value for c in at.caption)
    at = new_app(PAGE, model=TINY, text=TEXT, k=2, log=1).run()
    ok(at)
    assert at.selectbox(key="scale").value == "log"
    assert at.query_params["scale"] == "log" and "log" not in at.query_params
    res = engine(2)
    q = next(i for i, g in enumerate(res.tokens.generated) if g)
    want = res.layer(0, rows=slice(q, q + 1))[:, 0, : q + 1]
    np.testing.assert_allclose(z_of(heatmaps(specs(at)[0])[0]), np.log10(np.maximum(want, 1e-5)), atol=1e-5)
