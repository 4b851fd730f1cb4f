"""Every page's share link restores its view: a link with every parameter away from its default
opens the page with those values in the widgets, and the page writes the very same link back
(a parameter that was ignored would come back as its default)."""

from __future__ import annotations

import numpy as np
import pytest
import streamlit as st
from apptest import TEXT, TINY, engine, heatmaps, mounted, new_app, ok, share_link, titled, z_of

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


# -- the link of a page, and long texts compressed in it --------------------------------------
def test_share_link_carries_the_page_path(env):
    at = new_app(model=TINY, text=TEXT).run()
    assert share_link(at).startswith("/?model=tiny%3Allama-gqa&")  # no browser here: root-relative
    at = new_app("pages/3_Compare.py", model=TINY, text=TEXT).run()
    assert share_link(at).startswith("/Compare?model=")


def test_the_share_link_is_plain_text_not_a_highlighted_code_block(env):
    """Issue 40: ``st.code(link)`` syntax-highlighted a link carrying a compressed text (0.3–0.8 s
    of the browser's CPU on every page). The link is one plain-text element with a Copy button;
    no code block on the page carries it."""
    from ui import share_link as SL

    at = new_app(model=TINY, text="the bank " * 240).run()  # compressed into tz
    ok(at)
    link = share_link(at)
    assert "tz=" in link and len(mounted(at, SL.COMPONENT)) == 1
    assert not [c for c in at.code if "tz=" in c.value or c.value.startswith("/?")]
    assert "textContent = data.url" in SL.JS and "innerHTML" not in SL.JS  # text, never markup


def test_share_url_puts_the_path_before_the_query(env):
    from ui import state

    env.setattr(st.context.__class__, "url", property(lambda self: "http://host:8501"))
    assert state.share_url({"a": "1"}, path="") == "http://host:8501/?a=1"
    env.setattr(st.context.__class__, "url", property(lambda self: "http://host:8501/app/Compare"))
    assert state.share_url({"a": "1"}, path="Compare") == "http://host:8501/app/Compare?a=1"


# -- long texts travel compressed in the link -------------------------------------------------


def test_a_compressed_link_restores_the_exact_view(env):
    """A text over the readable-link length goes into ``tz`` (deflate + base64); opening that link
    restores the text character for character, the layer, the head and the options, and draws
    the engine's numbers for them."""
    from ui.params import ExplorerParams

    text = "the bank " * 240  # 2,160 characters, 482 tokens: compressed, and the tiny model runs it
    view = ExplorerParams(
        model=TINY, text=text, stack="self", layer=1, head=2, cmap="Magma", scale="linear", tok=7
    )
    link = view.to_query().params
    assert "tz" in link and "text" not in link and len(link["tz"]) < 200
    at = new_app(**link).run()
    ok(at)
    assert at.text_area(key="text").value == text
    assert at.slider(key="layer").value == 1 and at.selectbox(key="head").value == 2
    assert at.selectbox(key="cmap").value == "Magma"
    head = titled(at, "layer 1 · head 2 ")
    np.testing.assert_allclose(z_of(heatmaps(head)[0]), engine(text).layer(1)[2][:, :], atol=1e-6)
    assert at.query_params == link  # written back unchanged: the share link is the same link
    assert f"tz={link['tz']}" in share_link(at) and "text=" not in share_link(at)


def test_a_50000_character_text_survives_its_link(env):
    """Any text the app accepts fits a link once compressed: 50,000 characters come back exactly
    (the tiny model refuses that many tokens with its one-line message; the view keeps serving)."""
    from ui.params import MAX_TEXT_CHARS, ExplorerParams

    words = ["bank", "river", "the", "money", "flows", "near", "a", "quiet", "town", "\n"]
    rng = np.random.default_rng(0)
    text = " ".join(words[i] for i in rng.integers(0, len(words), 12_000))[:50_000]
    assert len(text) == 50_000 <= MAX_TEXT_CHARS
    link = ExplorerParams(model=TINY, text=text, layer=2, head=1, scale="log").to_query().params
    at = new_app(**link).run()
    assert not at.exception
    assert at.text_area(key="text").value == text
    assert at.query_params == link
    assert not [w.value for w in at.warning if "link" in w.value]
