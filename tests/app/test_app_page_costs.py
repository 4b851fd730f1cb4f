"""Pages cost what their engine work costs (issue 26): a widget change redoes no forward and
pools only the views it changes, a page switch back reuses the cached views, and the server
does not walk every imported object after each rerun."""

from __future__ import annotations

import subprocess
import sys

import pytest
from apptest import ROOT, TINY, new_app, ok

from attnviz.analysis import pooling

LONG = " ".join(["the bank of the river", "a quick brown fox jumps over the lazy dog"] * 110)
OVERVIEW = "pages/1_Model_overview.py"


def test_the_app_takes_its_imports_out_of_the_collectors_walk():
    """Streamlit runs a full garbage collection after every script run; with torch,
    transformers and plotly imported that walk was ~0.2 s of each rerun (ui.models freezes them)."""
    code = "import gc, ui.models; print(gc.get_freeze_count())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) > 100_000


@pytest.mark.slow
def test_a_widget_change_pools_only_the_view_it_changes(env, monkeypatch):
    from ui import models

    pooled, extracts = [], []
    real_pooled, real_extract = pooling.pooled, models.attnviz.extract

    def spy_pooled(res, layer, heads=None, **kw):
        pooled.append((layer, "all" if heads is None else str(tuple(heads)), tuple(kw["pools"])))
        return real_pooled(res, layer, heads, **kw)

    monkeypatch.setattr(pooling, "pooled", spy_pooled)

    def spy_extract(*args, **kw):
        extracts.append(1)
        return real_extract(*args, **kw)

    monkeypatch.setattr(models.attnviz, "extract", spy_extract)
    at = new_app(model=TINY, text=LONG, layer=1, head=2, pool="max").run()
    ok(at)
    assert len(extracts) == 1 and sorted(pooled) == [(1, "(2,)", ("max",)), (1, "all", ("max",))]
    pooled.clear()
    at.selectbox(key="head").set_value(3).run()
    ok(at)
    assert pooled == [(1, "(3,)", ("max",))]  # the new head only: the layer's grid is reused
    pooled.clear()
    at.slider(key="layer").set_value(0).run()
    ok(at)
    assert sorted(pooled) == [(0, "(3,)", ("max",)), (0, "all", ("max",))]  # the new layer, once each
    at.switch_page(OVERVIEW).run()
    ok(at)
    pooled.clear()
    at.switch_page("pages/0_Explorer.py").run()
    ok(at)
    assert pooled == [] and len(extracts) == 1  # back to a computed result: nothing recomputed
