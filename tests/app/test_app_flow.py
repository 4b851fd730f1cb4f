"""The overview's rollout section through AppTest: the numbers drawn are the engine's, coloured
by log₁₀ of the share by default (a sink no longer hides the rest), linear on request."""

from __future__ import annotations

import numpy as np
import pytest
import tiny
from apptest import TEXT, TINY, new_app, ok, titled, z_of

import attnviz
from attnviz.analysis.rollout import token_rollout
from attnviz.figures.flow import binned_sums, flow_map

PAGE = "pages/1_Model_overview.py"


def logged(x: np.ndarray) -> np.ndarray:
    """log10 colour from the decade of the smallest positive share up to 1."""
    lo = np.floor(np.log10(x[x > 0].min()))
    return np.clip(np.log10(np.maximum(x, 10.0**lo)), lo, 0)


def test_strip_and_flow_map_hold_the_rollout_of_the_chosen_token(env):
    res = attnviz.extract(tiny.loaded("llama-gqa"), TEXT)
    at = new_app(PAGE, model=TINY, text=TEXT).run()
    ok(at)
    last = token_rollout(res)
    # default: colour = log10 of the share, the share itself in the hover
    flow = titled(at, "flow into")["data"][0]
    np.testing.assert_allclose(z_of(flow), logged(last.sources), atol=1e-5)
    np.testing.assert_allclose(z_of({"z": flow["customdata"]}), last.sources, atol=1e-6)
    assert flow["zmin"] == np.floor(np.log10(last.sources[last.sources > 0].min())) and flow["zmax"] == 0
    strip = titled(at, "sources of")["data"][0]
    np.testing.assert_allclose(z_of(strip)[0], logged(last.rollout), atol=1e-5)
    assert any("Colour is log₁₀ of the share" in c.value for c in at.caption)
    at.segmented_control(key="rollout_scale").set_value("linear").run()
    ok(at)
    np.testing.assert_allclose(z_of(titled(at, "flow into")["data"][0]), last.sources, atol=1e-6)
    np.testing.assert_allclose(z_of(titled(at, "sources of")["data"][0])[0], last.rollout, atol=1e-6)
    at.selectbox(key="rollout_token").set_value(2).run()
    at.toggle(key="rollout_sink").set_value(True).run()
    ok(at)
    want = token_rollout(res, 2, sink_aware=True)
    np.testing.assert_allclose(z_of(titled(at, "flow into")["data"][0]), want.sources, atol=1e-6)
    assert (want.sources[:, 3:] == 0).all() and want.sources[-1, 2] > 0  # causal: nothing after token 2


def test_long_texts_are_binned_and_keep_their_mass():
    sources = np.random.default_rng(0).dirichlet(np.ones(5000), size=4)  # (layers, tokens)
    labels = [f"({i}) t" for i in range(5000)]
    z, bins = binned_sums(sources, labels)
    assert z.shape == (4, 1024) and len(bins) == 1024
    np.testing.assert_allclose(z.sum(-1), 1.0)
    fig = flow_map(sources, labels, title="flow")
    assert np.asarray(fig.data[0].z).shape == (4, 1024)


@pytest.mark.slow
def test_on_smollm2_the_default_shows_more_than_the_first_token(env):
    """SmolLM2's rollout puts most of the last token's flow on token 0 (a linear strip is one
    bright cell); the default log colour spreads the other tokens over several colour steps."""
    text = "The old lighthouse keeper walked down to the river bank every morning and counted the boats."
    at = new_app(PAGE, model="smollm2-135m", text=text).run(timeout=300)
    ok(at)
    strip = titled(at, "sources of")["data"][0]
    share = z_of({"z": strip["customdata"]})[0]
    assert share[0] > 0.5  # the sink dominates: linear colour would show little else
    rest = z_of(strip)[0][1:]
    assert rest.max() - rest.min() > 1.5  # > 1.5 decades of visible structure in the rest
    linear_rest = share[1:] / share.max()  # what a linear scale would give the rest (0..1 of range)
    assert linear_rest.max() < 1e-3  # linear: every other token the darkest colour
