"""From-scratch page through AppTest: the real layer recomputed step by step, counterfactuals,
and the toy mode with random weights."""

from __future__ import annotations

import numpy as np
import pytest
from apptest import TEXT, TINY, heatmaps, labels, new_app, ok, specs, titled, z_of

from attnviz.reference import walkthrough as W

PAGE = "pages/2_From_scratch.py"


def metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_real_layer_matches_the_model_and_shows_the_shape_table(env):
    at = new_app(PAGE, model=TINY, text=TEXT, layer=1, head=2).run()
    ok(at)
    shown = metrics(at)
    assert set(shown) == {"max |Δ| weights vs model", "max |Δ| concat vs model", "max |Δ| output vs model"}
    assert all(v.endswith("✓") for v in shown.values()), shown
    shapes = at.dataframe[0].value
    assert list(shapes.columns) == ["step", "operation", "shape"]
    n = len(labels(TEXT))
    assert f"(1, 2, {n}, 16)" in list(shapes["shape"])  # K: 2 KV heads, n tokens, head_dim 16
    # the default step is the softmax output, drawn for the chosen head
    assert at.radio(key="wstep").value == "probs"
    probs = titled(at, "probs · head 2")
    assert np.allclose(z_of(heatmaps(probs)[0]).sum(-1), 1.0, atol=1e-5)


def test_every_step_draws_and_k_uses_the_kv_head(env):
    at = new_app(PAGE, model=TINY, text=TEXT, head=3).run()
    names = at.radio(key="wstep").options
    assert [n.split(" ", 2)[1] for n in names[:4]] == ["x", "q_proj", "k_proj", "v_proj"]
    at.radio(key="wstep").set_value("k_rope").run()
    ok(at)
    titled(at, "k_rope · KV head 1 (read by query head 3)")
    at.radio(key="wstep").set_value("scores_masked").run()
    ok(at)
    z = z_of(heatmaps(titled(at, "scores_masked"))[0])
    assert np.isnan(z[0, 1]) and np.isfinite(z[1, 0])  # the masked upper triangle is a gap


@pytest.mark.parametrize("change", ["no RoPE", "no mask", "no scaling", "ungrouped K/V"])
def test_counterfactuals_redraw_the_pattern(env, change):
    at = new_app(PAGE, model=TINY, text=TEXT, layer=0, head=1, change=change).run()
    ok(at)
    real = z_of(heatmaps(titled(at, "real · layer 0 · head 1"))[0])
    changed = z_of(heatmaps(titled(at, f"{change} · layer 0 · head 1"))[0])
    assert real.shape == changed.shape and not np.allclose(real, changed)
    if change == "no mask":
        assert np.triu(changed, 1).sum() > 0 and np.triu(real, 1).sum() == 0


def test_counterfactuals_that_do_not_apply_say_why(env):
    at = new_app(PAGE, model="tiny:bert", text=TEXT, change="no mask").run()
    assert not at.exception
    assert any("does not apply" in i.value and "encoder" in i.value for i in at.info)
    at.segmented_control(key="change").set_value("ungrouped K/V").run()
    assert any("no GQA" in i.value for i in at.info)


def test_toy_mode_matches_torch_and_has_one_heatmap_per_head(env):
    at = new_app(PAGE, mode="toy", toy_h=8, toy_d=64, toy_n=12, toy_causal=1).run()
    ok(at)
    shown = metrics(at)
    assert shown["max |Δ| weights vs torch.nn.MultiheadAttention"].endswith("✓")
    grid = specs(at)[0]
    assert len(heatmaps(grid)) == 8
    z = z_of(heatmaps(grid)[0])
    assert z.shape == (12, 12) and np.triu(z, 1).max() == 0  # causal
    at.toggle(key="toy_causal").set_value(False).run()
    assert np.triu(z_of(heatmaps(specs(at)[0])[0]), 1).max() > 0
    at.select_slider(key="toy_h").set_value(2).run()  # d_model stays a multiple of the heads
    ok(at)
    assert at.select_slider(key="toy_d").value % 2 == 0 and len(heatmaps(specs(at)[0])) == 2
    assert at.query_params["mode"] == "toy" and at.query_params["toy_h"] == "2"


def test_encoder_decoder_models_get_a_clear_message(env):
    at = new_app(PAGE, model="tiny:bart", text=TEXT).run()
    assert not at.exception
    assert "encoder-decoder" in at.error[0].value and "toy mode" in at.error[0].value


def test_too_long_for_the_walkthrough_shows_the_first_tokens(env):
    text = "the bank of the river " * (W.DEFAULT_MAX_TOKENS // 4)
    at = new_app(PAGE, model=TINY, text=text).run()
    ok(at)
    assert f"shows the first {W.DEFAULT_MAX_TOKENS} tokens" in at.warning[0].value
    assert any(f"{W.DEFAULT_MAX_TOKENS} tokens" in c.value for c in at.caption)
