"""The overview's rollout section through AppTest: the numbers drawn are the engine's."""

from __future__ import annotations

import numpy as np
import pytest
import tiny
from test_app_explorer import TEXT, TINY, new_app, ok, prepare, titled, z_of

import attnviz
from attnviz.figures.flow import binned_sums, flow_map
from attnviz.rollout import token_rollout

PAGE = "pages/1_Model_overview.py"


@pytest.fixture
def env(monkeypatch):
    return prepare(monkeypatch)


def test_strip_and_flow_map_hold_the_rollout_of_the_chosen_token(env):
    res = attnviz.extract(tiny.loaded("llama-gqa"), TEXT)
    at = new_app(PAGE, model=TINY, text=TEXT).run()
    ok(at)
    last = token_rollout(res)
    flow = titled(at, "flow into")["data"][0]
    np.testing.assert_allclose(z_of(flow), last.sources, atol=1e-6)
    strip = titled(at, "sources of")["data"][0]
    np.testing.assert_allclose(z_of(strip)[0], last.rollout, atol=1e-6)
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
