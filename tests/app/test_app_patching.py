"""The Explain page's Patching view through AppTest on a tiny model: both prompts with the
differing token marked, the patching heatmap (the engine's numbers), the estimate labelled and
beside its real patches, the link carrying the view, a clicked head opening in the explorer."""

from __future__ import annotations

import numpy as np
import pytest
import tiny
from apptest import TEXT, TINY, new_app, ok, open_clicked_head, prepare, specs, z_of

import attnviz

PAGE = "pages/6_Explain.py"
CORRUPT = "the bank of the fox"


@pytest.fixture
def env(monkeypatch):
    return prepare(monkeypatch)


def titles(at) -> list[str]:
    return [(s["layout"].get("title") or {}).get("text", "") for s in specs(at)]


def test_patching_view_draws_the_engines_grid_and_the_link_carries_it(env):
    at = new_app(PAGE, model=TINY, text=TEXT, view="patching", corrupt=CORRUPT, over="heads").run()
    ok(at)
    assert any(":red-background[**fox**]" in m.value for m in at.markdown)  # the differing token
    assert any(":red-background[**river**]" in m.value for m in at.markdown)
    fig = next(
        s for s in specs(at) if "activation patching" in (s["layout"].get("title") or {}).get("text", "")
    )
    lm = tiny.loaded("llama-gqa")
    want = attnviz.patch(lm, TEXT, CORRUPT, over="heads")
    assert np.allclose(z_of(fig["data"][0]), want.values, atol=1e-5)
    assert fig["data"][0]["zmid"] == 0
    assert at.query_params["view"] == "patching" and at.query_params["corrupt"] == CORRUPT
    at.segmented_control(key="pdir").set_value("noise").run()
    ok(at)
    assert at.query_params["pdir"] == "noise"
    assert any("· noise<br>" in t for t in titles(at))
    open_clicked_head(at, "patch_chart", "patch_open", 1, 2)  # a clicked head opens in the explorer


def test_the_estimate_is_labelled_and_shown_beside_real_patches(env):
    at = new_app(
        PAGE, model=TINY, text=TEXT, view="patching", corrupt=CORRUPT, over="residual", pest="1"
    ).run()
    ok(at)
    fig = next(s for s in specs(at) if "ESTIMATE" in (s["layout"].get("title") or {}).get("text", ""))
    assert len(fig["data"]) == 3  # estimate | real | difference
    assert any("**ESTIMATE**" in c.value for c in at.caption)


def test_without_a_corrupted_prompt_the_view_says_what_to_do(env):
    at = new_app(PAGE, model=TINY, text=TEXT, view="patching").run()
    ok(at)
    assert any("corrupted prompt" in i.value for i in at.info)


def test_the_forward_guard_counts_the_grid_the_engine_runs(env):
    """The page's 2,048-forward guard counts `planned_grid`, the engine's own grid: prompts of
    different lengths pair fewer positions than the longer prompt has (here 7 of 10). Caught: the
    page re-derived the grid as layers × heads × the longer prompt's length (120 cells, not 84),
    so it could refuse (or allow) another grid than the one that runs."""
    import ui.explain.patching

    longer = "the bank of the quick brown fox"
    lm = tiny.loaded("llama-gqa")
    cells = attnviz.patch(lm, TEXT, longer, over="heads_by_position").values.size
    assert cells == 3 * 4 * 7
    env.setattr(ui.explain.patching, "MAX_UI_CELLS", cells - 1)
    at = new_app(PAGE, model=TINY, text=TEXT, view="patching", corrupt=longer, over="heads_by_position").run()
    ok(at)
    assert any(w.value.startswith(f"{cells} cells would be {cells} forwards") for w in at.warning)
    env.setattr(ui.explain.patching, "MAX_UI_CELLS", cells)
    at.run()
    ok(at)
    assert not at.warning and any("activation patching" in t for t in titles(at))
