"""Pages cost what their engine work costs (issue 26): a widget change redoes no forward and
pools only the views it changes, a page switch back reuses the cached views, and the server
does not walk every imported object after each rerun."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from apptest import ROOT, TINY, new_app, ok

from attnviz.analysis import pooling

LONG = " ".join(["the bank of the river", "a quick brown fox jumps over the lazy dog"] * 110)
OVERVIEW = "pages/1_Model_overview.py"


@pytest.mark.slow  # a fresh interpreter that imports torch: 7-9 s
def test_the_app_takes_its_imports_out_of_the_collectors_walk():
    """Streamlit runs a full garbage collection after every script run; with torch,
    transformers and plotly imported that walk was ~0.2 s of each rerun (ui.models freezes them)."""
    code = "import gc, ui.models; print(gc.get_freeze_count())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) > 100_000


@pytest.mark.slow  # a fresh interpreter that imports torch: 7-9 s
def test_torchs_workers_sleep_between_operations_in_the_app():
    """The app sets OMP_WAIT_POLICY=PASSIVE before torch is first imported (libgomp reads it
    then): spinning workers took the CPU the browser draws with. A fresh interpreter records the
    policy at the moment anything imports torch, then runs the app."""
    code = (
        "import os, sys\n"
        "seen = []\n"
        "def hook(event, args):\n"
        "    if event == 'import' and args[0] == 'torch' and not seen:\n"
        "        seen.append(os.environ.get('OMP_WAIT_POLICY'))\n"
        "sys.addaudithook(hook)\n"
        "from streamlit.testing.v1 import AppTest\n"
        "assert 'torch' not in sys.modules\n"
        "AppTest.from_file('app.py', default_timeout=300).run()\n"
        "print(seen)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["ATTNVIZ_DEMO"] = "0"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "['PASSIVE']", out.stdout[-500:]


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


@pytest.mark.slow
def test_a_long_texts_overview_rolls_out_when_asked(env, monkeypatch):
    """The rollout (below the fold, ~half a forward at 1,500 tokens) runs past 1,024 tokens only
    when its toggle is on; a short text still shows it at once."""
    from ui.overview import flow

    calls = []
    real = flow.token_rollout
    monkeypatch.setattr(flow, "token_rollout", lambda *a, **k: calls.append(1) or real(*a, **k))
    at = new_app(OVERVIEW, model=TINY, text=LONG, induction=0).run()
    ok(at)
    assert calls == [] and not [c for c in at.get("plotly_chart") if "flow into" in c.proto.spec]
    at.toggle(key="rollout_on").set_value(True).run()
    ok(at)
    assert calls == [1] and [c for c in at.get("plotly_chart") if "flow into" in c.proto.spec]
    short = new_app(OVERVIEW, model=TINY, text="the bank of the river", induction=0).run()
    ok(short)
    assert calls == [1, 1]


@pytest.mark.slow
def test_the_overview_draws_its_statistics_before_it_pools_every_head(env, monkeypatch):
    """The statistics and the head finder are sent before the mosaic is pooled (the browser
    draws them while the server pools every head), and the mosaic still sits above them."""
    from ui import head_stats

    calls = []
    real_pooled, real_metrics = pooling.pooled, head_stats.head_metrics

    def spy_pooled(*a, **k):
        calls.append("pool")
        return real_pooled(*a, **k)

    def spy_metrics(*a, **k):
        calls.append("stats")
        return real_metrics(*a, **k)

    monkeypatch.setattr(pooling, "pooled", spy_pooled)
    monkeypatch.setattr(head_stats, "head_metrics", spy_metrics)
    at = new_app(OVERVIEW, model=TINY, text=LONG, induction=0).run()
    ok(at)
    assert calls[0] == "stats" and "pool" in calls
    heads = [s.value for s in at.subheader]
    assert heads.index(next(h for h in heads if h.startswith("Every head"))) < heads.index("Head statistics")
    assert heads.index("Head statistics") < heads.index("Head finder")
