"""Every page on pure recurrent / state-space models (no softmax attention at all: Mamba-1,
Mamba-2, FalconMamba, RWKV-4, served as ``hybrid:<model_type>``): no exception, and either a view of the
model's own mixers or one message that says why the page has nothing to draw."""

from __future__ import annotations

import hybrids_tiny
import pytest
from apptest import TEXT, new_app, specs

hybrids_tiny.register()
PURE = ["mamba", "mamba2", "falcon_mamba", "rwkv"]
NO_HEADS = "has no softmax attention"


def _said(at, text: str) -> list[str]:
    return [m.value for m in [*at.info, *at.error, *at.warning] if text in m.value]


def _titles(at) -> list[str]:
    return [(s["layout"].get("title") or {}).get("text", "") for s in specs(at)]


@pytest.mark.parametrize("model_type", PURE)
def test_explorer_and_overview_show_the_mixers(env, model_type):
    at = new_app(model=f"hybrid:{model_type}", text=TEXT).run()
    assert not at.exception and not at.warning, [e.value for e in [*at.exception, *at.warning]]
    assert any("block 0 · head 0" in t for t in _titles(at))
    over = new_app("pages/1_Model_overview.py", model=f"hybrid:{model_type}", text=TEXT).run()
    assert not over.exception and not over.warning
    assert sorted(set(over.dataframe[0].value["block"])) == [0, 1]


@pytest.mark.parametrize("model_type", PURE)
@pytest.mark.parametrize("page", ["pages/3_Compare.py", "pages/5_Head_atlas.py"])
def test_pages_that_need_softmax_heads_say_why(env, model_type, page):
    at = new_app(page, model=f"hybrid:{model_type}", text=TEXT).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not [w.value for w in at.warning]  # no "layer 0 is out of range (0–-1)"
    said = _said(at, NO_HEADS)
    assert len(said) == 1 and "in blocks 0, 1" in said[0], said
    assert not specs(at)  # no empty or made-up attention chart


@pytest.mark.parametrize("model_type", PURE)
def test_the_explain_page_opens_on_their_routes(env, model_type):
    at = new_app("pages/6_Explain.py", model=f"hybrid:{model_type}", text=TEXT).run()
    assert not at.exception and not at.warning and not at.error, [m.value for m in [*at.exception, *at.error]]
    assert any(t.startswith("Routes") for t in _titles(at))


def test_from_scratch_walks_through_ssd_and_refuses_per_channel_kinds(env):
    at = new_app("pages/2_From_scratch.py", model="hybrid:mamba2", text=TEXT).run()
    assert not at.exception and not at.warning
    assert any("closed form" in t for t in _titles(at))
    for model_type in ("mamba", "rwkv"):
        at = new_app("pages/2_From_scratch.py", model=f"hybrid:{model_type}", text=TEXT).run()
        assert not at.exception, [e.value for e in at.exception]
        assert not at.warning and len(_said(at, NO_HEADS)) == 1
