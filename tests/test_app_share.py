"""Every page's share link restores its view: a link with every parameter away from its default
opens the page with those values in the widgets, and the page writes the very same link back
(a parameter that was ignored would come back as its default)."""

from __future__ import annotations

import pytest
from test_app_explorer import TEXT, TINY, new_app, ok, prepare

from ui import params as P

LINKS = {
    "pages/0_Explorer.py": P.ExplorerParams(
        model=TINY,
        text=TEXT,
        stack="self",
        layer=2,
        head=1,
        cmap="Magma",
        scale="perhead",
        nosink=True,
        tok=3,
    ),
    "pages/1_Model_overview.py": P.OverviewParams(
        model=TINY, text=TEXT, stack="self", cmap="Blues", scale="rank", metric="sink"
    ),
    "pages/2_From_scratch.py": P.ScratchParams(
        model=TINY, text=TEXT, layer=1, head=3, wstep="scores_raw", change="no mask"
    ),
    "pages/3_Compare.py": P.CompareParams(
        model=TINY,
        text=TEXT,
        text2="the bank of the lazy dog",
        stack="self",
        layer=2,
        head=3,
        cmap="Greys",
        scale="linear",
    ),
    "pages/4_Generation.py": P.GenerationParams(
        model=TINY,
        text=TEXT,
        k=3,
        stack="self",
        gstep=2,
        layer=1,
        grow="predicting position",
        cmap="Inferno",
        scale="log",
    ),
    "toy": P.ScratchParams(mode="toy", toy_d=64, toy_h=8, toy_n=12, toy_causal=False, toy_seed=7, head=5),
}


@pytest.fixture
def env(monkeypatch):
    return prepare(monkeypatch)


@pytest.mark.parametrize("page", list(LINKS))
def test_the_link_is_the_view(env, page):
    p = LINKS[page]
    link = p.to_query().params
    at = new_app("pages/2_From_scratch.py" if page == "toy" else page, **link).run()
    ok(at)
    assert not at.warning, [w.value for w in at.warning]
    for name in p.names():  # the widgets (keys = names) hold the link's values
        if name not in ("model", "model2"):  # the model pickers have keys of their own
            assert at.session_state[name] == getattr(p, name), name
    assert at.session_state["model_choice"] in (p.model, "Other: a Hub id or a local folder…")
    assert at.query_params == link
