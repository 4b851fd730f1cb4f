"""Generation on hybrids and pure recurrent models: each new token's row of every head of a
non-softmax mixer block, the engine's exact row of the prompt + generated tokens (diverging at 0
for a signed mixer, ‖c‖ for a per-channel one); the softmax heads' rows stay where they were."""

from __future__ import annotations

import hybrids_tiny
import numpy as np
from apptest import TEXT, heatmaps, new_app, ok, specs, titled, z_of

import attnviz
from ui.generation.mixers import BLOCK_KEY

hybrids_tiny.register()
PAGE = "pages/4_Generation.py"


def _engine(model_type: str, k: int) -> attnviz.AttentionResult:
    return attnviz.extract(hybrids_tiny.loaded(model_type), TEXT, generate=k)


def test_a_hybrids_mixer_block_shows_the_new_tokens_row_per_head(env):
    at = new_app(PAGE, model="hybrid:qwen3_5_text", text=TEXT, k=3).run()
    ok(at)
    res = _engine("qwen3_5_text", 3)
    gen = [i for i, g in enumerate(res.tokens.generated) if g]
    at.select_slider(key="gstep").set_value(2).run()
    ok(at)
    q = gen[1]
    assert heatmaps(specs(at)[0])  # the softmax heads' rows first, as before
    picker = at.selectbox(key=BLOCK_KEY)
    assert picker.options == ["block 0 · Gated DeltaNet", "block 2 · Gated DeltaNet"]
    picker.set_value(1).run()
    ok(at)
    fig = titled(at, "block 2 · query")
    trace = heatmaps(fig)[0]
    want = res.layer(2, mixer="gated_delta")[:, q, : q + 1]
    assert trace["y"] == [f"head {h}" for h in range(4)]
    np.testing.assert_allclose(z_of(trace), want, atol=1e-7)
    assert (want < 0).any() and fig["layout"]["coloraxis"]["cmid"] == 0  # signed: diverging at 0
    # the rows came from generate's own prefill and decode steps, each step's row checked
    assert [c.value for c in at.caption if "+ 3 × torch_recurrent_gated_delta_rule" in c.value]


def test_a_pure_recurrent_model_shows_its_mixer_rows_instead_of_refusing(env):
    at = new_app(PAGE, model="hybrid:mamba", text=TEXT, k=2).run()
    assert not at.exception and not at.warning, [e.value for e in [*at.exception, *at.warning]]
    res = _engine("mamba", 2)
    q = next(i for i, g in enumerate(res.tokens.generated) if g)
    trace = heatmaps(titled(at, "block 0 · query"))[0]
    np.testing.assert_allclose(z_of(trace), res.layer(0, mixer="mamba")[:, q, : q + 1], atol=1e-7)
    assert "‖c‖" in trace["hovertemplate"] and (z_of(trace) >= 0).all()
    assert [m.value for m in at.info if "has no softmax attention" in m.value]
