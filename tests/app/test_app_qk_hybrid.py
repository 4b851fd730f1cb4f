"""The "why this head attends" view on a tiny hybrid (tests/hybrids_tiny.py) and its rotary-band
chart: the page reads the stream at block boundaries and draws the engine's terms, parts named by
the model's own block index; a clicked softmax head part opens in the explorer at its attention
layer; the band chart's columns are the top terms split by band and sum to them."""

from __future__ import annotations

import hybrids_tiny
import numpy as np
import pytest
from apptest import TEXT, TINY, new_app, ok, prepare, specs, z_of

import attnviz
from attnviz.figures import qk as FQ

PAGE = "pages/6_Explain.py"
VIEW = "why this head attends"
hybrids_tiny.register()


@pytest.fixture
def env(monkeypatch):
    return prepare(monkeypatch)


def _titled(at, start: str) -> dict:
    return next(s for s in specs(at) if (s["layout"].get("title") or {}).get("text", "").startswith(start))


def test_a_hybrid_attention_head_is_split_into_every_earlier_blocks_parts(env):
    at = new_app(PAGE, model="hybrid:qwen3_5_text", text=TEXT, view=VIEW, wl="1", wh="2", pos="-1", wk="3")
    at.run()
    ok(at)
    fig = _titled(at, "Why L3H2 attends")  # attention layer 1 is the model's block 3
    heat = next(t for t in fig["data"] if t["type"] == "heatmap")
    assert "L0.gated_delta1" in heat["x"] and "L1H2" in heat["x"] and "L2.mlp" in heat["x"]
    cell = attnviz.qk_attribution(hybrids_tiny.loaded("qwen3_5_text"), TEXT, layer=1, head=2, query=-1, key=3)
    np.testing.assert_allclose(z_of(heat), cell.terms, rtol=1e-5, atol=1e-6)  # the engine's terms
    assert any("block boundaries" in c.value for c in at.caption)
    assert FQ.part_words("L0.gated_delta3") == "L0's gated_delta head 3 output"
    assert FQ.part_words("L2.mamba21") == "L2's mamba2 head 1 output"  # the kind ends in a digit
    assert FQ.part_words("L0.short_conv") == "L0's short_conv output"  # per channel: no heads
    at.toggle(key="qk_space_on").set_value(True).run()
    ok(at)
    _titled(at, "L3H2's queries and keys")  # the scatter names the head by its block too
    at.toggle(key="qk_ov_on").set_value(True).run()
    ok(at)
    assert _titled(at, "OV circuits")["data"][0]["y"] == ["L1", "L3"]  # attention rows by block
    # a clicked softmax head's part (block 1, head 2) opens in the explorer at attention layer 0
    at.session_state["qk_chart"] = {"selection": {"points": [{"customdata": [1, 2]}], "point_indices": [0]}}
    at.run()
    ok(at)
    button = next(b for b in at.button if b.label.startswith("Open layer 1, head 2"))
    button.click().run()
    assert at.query_params.get("layer") in (None, "0") and at.query_params.get("head") == "2"


def test_the_top_terms_by_rotary_band(env):
    at = new_app(PAGE, model=TINY, text=TEXT, view=VIEW, wl="2", wh="1", pos="-1", wk="2").run()
    at.toggle(key="qk_bands_on").set_value(True).run()
    ok(at)
    bands = _titled(at, "The top terms by rotary band")
    heat = bands["data"][0]
    z = np.asarray(z_of(heat), dtype=float)
    assert heat["y"][0].startswith("band 0") and z.shape[1] == 10
    why = next(t for t in _titled(at, "Why L2H1")["data"] if t["type"] == "heatmap")
    terms = np.sort(np.abs(np.asarray(z_of(why), dtype=float)).ravel())[::-1][:10]
    np.testing.assert_allclose(np.sort(np.abs(z.sum(0)))[::-1], terms, rtol=1e-6, atol=1e-9)
