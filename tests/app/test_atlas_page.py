"""The atlas page keeps serving when its disk cache cannot take results, resumes a stopped run
with a button that says how far it got, and offers the Ray cluster only when the server names one
(the Ray run itself: test_atlas_ray.py)."""

from __future__ import annotations

import errno
import os

import pytest
from apptest import TINY, new_app, ok, prepare

from attnviz import atlas as AT

ATLAS = "pages/5_Head_atlas.py"


@pytest.fixture
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path))
    monkeypatch.delenv("ATTNVIZ_RAY_ADDRESS", raising=False)
    return prepare(monkeypatch)


def test_a_full_disk_is_a_warning_and_the_page_shows_the_atlas(env, monkeypatch, tmp_path):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    at = new_app(ATLAS, model=TINY, ntexts=4).run()
    ok(at)
    at.button(key="atlas_run").click().run()
    ok(at)
    assert len(at.warning) == 1 and "is full" in at.warning[0].value and str(tmp_path) in at.warning[0].value
    assert len(at.dataframe[0].value) == 12  # the result of the run is shown all the same


def test_a_stopped_run_resumes_from_a_button_that_says_how_far_it_got(env, monkeypatch):
    import tiny

    from attnviz.atlas import local

    AT.run_atlas(tiny.loaded("llama-gqa"), AT.builtin_corpus()[:3])  # as if a run stopped after 3
    at = new_app(ATLAS, model=TINY, ntexts=5).run()
    ok(at)
    button = at.button(key="atlas_run")
    assert button.label == "Resume the atlas (3 of 5 texts done)"
    assert "atlas_engine" not in engine_keys(at)  # no ATTNVIZ_RAY_ADDRESS: no choice of engine
    ran, real = [], local.compute_entry
    monkeypatch.setattr(local, "compute_entry", lambda *a, **kw: ran.append(a[2]) or real(*a, **kw))
    button.click().run()
    ok(at)
    assert ran == AT.builtin_corpus()[3:5]  # only the two missing texts ran
    assert any(c.value.startswith("5 texts, 2 computed in") for c in at.caption)  # this run, not the cache


def engine_keys(at) -> list[str]:
    return [w.key for w in at.get("button_group")]


def test_the_engine_choice_appears_when_the_server_names_a_ray_cluster(env, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_RAY_ADDRESS", "head-node:6379")
    at = new_app(ATLAS, model=TINY, ntexts=5).run()
    ok(at)
    assert at.segmented_control(key="atlas_engine").options == ["this server", "Ray cluster"]
    assert at.segmented_control(key="atlas_engine").value == "this server"
    assert "atlas_engine" in engine_keys(at)


@pytest.mark.slow  # a fresh interpreter that imports torch, transformers and Streamlit
def test_the_app_never_imports_ray_unless_a_cluster_is_named(tmp_path):
    """The whole app (home page, then the atlas page running a corpus) in a fresh interpreter
    without ATTNVIZ_RAY_ADDRESS: Ray stays out of sys.modules."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = (
        "import sys\n"
        "sys.path.insert(0, 'tests')\n"
        "import tiny; tiny.register()\n"
        "from streamlit.testing.v1 import AppTest\n"
        "at = AppTest.from_file('app.py', default_timeout=240)\n"
        "at.query_params['model'] = 'tiny:llama-gqa'; at.query_params['ntexts'] = '3'\n"
        "at.run(); assert not at.exception, at.exception\n"
        "at.switch_page('pages/5_Head_atlas.py'); at.run()\n"
        "at.button(key='atlas_run').click().run(); assert not at.exception, at.exception\n"
        "assert len(at.dataframe[0].value) == 12\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ATTNVIZ_RAY_ADDRESS"}
    env.update(PYTHONPATH=str(root), ATTNVIZ_CACHE=str(tmp_path), HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_a_cancelled_run_shows_the_atlas_of_the_texts_done_so_far(env):
    import tiny

    AT.run_atlas(tiny.loaded("llama-gqa"), AT.builtin_corpus()[:3])  # as if Cancel came after 3
    at = new_app(ATLAS, model=TINY, ntexts=5)
    at.session_state["atlas_cancel"] = True  # the rerun the Cancel click starts
    at.run()
    ok(at)
    assert "3 of 5 texts done so far are saved" in at.info[0].value
    assert at.button(key="atlas_run").label == "Resume the atlas (3 of 5 texts done)"
    assert len(at.dataframe) == 1 and len(at.dataframe[0].value) == 12  # the 3 texts' ranking
    assert any(c.value.startswith("3 texts") for c in at.caption)


def test_no_stale_resume_button_is_left_lit_once_the_run_starts(env, monkeypatch):
    """What the page holds while the run goes, seen when it stops on an error: the progress is
    cleared and the only button is a fresh "Run again", not the "Resume (3 of 5)" just clicked."""
    import tiny

    from attnviz import AttnvizError
    from attnviz.atlas import local

    AT.run_atlas(tiny.loaded("llama-gqa"), AT.builtin_corpus()[:3])
    at = new_app(ATLAS, model=TINY, ntexts=5).run()

    def fails(*a, **kw):
        raise AttnvizError("the disk went away")

    monkeypatch.setattr(local, "compute_entry", fails)
    at.button(key="atlas_run").click().run()
    assert "the disk went away" in at.error[0].value
    assert [b.key for b in at.button] == ["atlas_retry"]


def test_a_saved_atlas_of_other_weights_offers_to_start_over(env, monkeypatch):
    """The disk cache holds this model's atlas from other weights (the model changed since): the
    page never shows those numbers; it says why and offers to start over, which computes every
    text again for these weights and shows their atlas."""
    import json

    import tiny

    lm = tiny.loaded("llama-gqa")
    corpus = AT.builtin_corpus()[:3]
    old = AT.run_atlas(lm, corpus)
    manifest = next(AT.AtlasCache.for_namespace("x").folder.parent.glob("*/model.json"))
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "fingerprint": "weights-of-before"}))
    at = new_app(ATLAS, model=TINY, ntexts=3).run()
    ok(at)
    assert not at.dataframe and any("comes from other weights" in w.value for w in at.warning)
    at.button(key="atlas_fresh").click().run()
    ok(at)
    assert not at.warning and len(at.dataframe[0].value) == len(old.ranking("entropy"))
    assert json.loads(manifest.read_text())["fingerprint"] == data["fingerprint"]  # the new weights'
