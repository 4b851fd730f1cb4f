"""Results live in the bounded caches only: nothing a session keeps (fragments, download
callables, format functions) holds a result, and an evicted one is extracted again on demand."""

from __future__ import annotations

import io

import numpy as np
import pytest
from apptest import TEXT, TINY, heatmaps, new_app, ok, titled, z_of

import attnviz


def deferred_downloads(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """Record the data callables of download buttons by file name (Streamlit runs them when one
    is clicked, in a worker thread, long after the run)."""
    from streamlit.runtime.media_file_manager import MediaFileManager

    seen: dict[str, object] = {}
    real = MediaFileManager.add_deferred

    def add_deferred(self, data_callable, mimetype, coordinates, file_name=None, **kwargs):
        seen[str(file_name)] = data_callable
        return real(self, data_callable, mimetype, coordinates, file_name, **kwargs)

    monkeypatch.setattr(MediaFileManager, "add_deferred", add_deferred)
    return seen


def track_results(monkeypatch: pytest.MonkeyPatch) -> list:
    """Weak references to every AttentionResult the app extracts from now on."""
    import weakref

    made: list = []
    real = attnviz.extract

    def extract(*args, **kwargs):
        res = real(*args, **kwargs)
        made.append(weakref.ref(res))
        return res

    monkeypatch.setattr(attnviz, "extract", extract)
    return made


@pytest.mark.parametrize(
    ("page", "params"),
    [
        ("app.py", {}),
        ("pages/1_Model_overview.py", {}),
        ("pages/3_Compare.py", {"text2": "the bank of the lazy dog"}),
        ("pages/4_Generation.py", {"k": 3}),
    ],
)
def test_no_result_outlives_the_cache(env, page, params):
    """Streamlit keeps a session's fragments, download callables and widget format functions (and
    the page globals they reach) for minutes after the visitor leaves. They hold a ResultRef,
    never a result: once the bounded caches let go, no result is left alive."""
    import gc

    from ui import models

    made = track_results(env)
    at = new_app(page, model=TINY, text=TEXT, **params).run()
    ok(at)
    assert made
    models.results_cache()._items.clear()
    models._derived()._items.clear()
    gc.collect()
    alive = [r() for r in made if r() is not None]
    assert not alive, f"{len(alive)} result(s) held outside the cache"


def test_an_evicted_result_is_extracted_again_when_the_view_redraws(env):
    from ui import models

    at = new_app(model=TINY, text=TEXT).run()
    models.results_cache()._items.clear()
    at.selectbox(key="head").set_value(1).run()
    ok(at)
    trace = heatmaps(titled(at, "layer 0 · head 1 "))[0]
    assert np.allclose(z_of(trace).sum(-1), 1.0, atol=1e-5)


def test_downloads_fetch_the_result_when_clicked_even_after_an_eviction(env):
    import tiny

    from ui import models

    seen = deferred_downloads(env)
    at = new_app(model=TINY, text=TEXT, layer=1, head=2).run()
    ok(at)
    ((first, _),) = models.results_cache()._items.values()
    assert first.checks  # the page's run checked itself against eager
    models.results_cache()._items.clear()
    name = "attnviz_tiny-llama-gqa_L1_H2"
    data = np.load(io.BytesIO(seen[f"{name}.npz"]()))  # outside the script run, like a click
    expected = attnviz.extract(tiny.loaded("llama-gqa"), TEXT).head(1, 2)
    np.testing.assert_allclose(data["attention"], expected, atol=1e-6)
    assert str(data["model"]) == "tiny-llama-gqa" and int(data["head"]) == 2
    assert seen[f"{name}.csv"]().splitlines()[0].startswith("query \\ key,(0) ")
    assert b"plotly" in seen[f"{name}.html"]().lower()
    assert len(models.results_cache()) == 1  # the re-run went back into the bounded cache
    # the same engine call as the page's own run: a re-run result carries the same self-check
    ((again, _),) = models.results_cache()._items.values()
    assert [c.stack for c in again.checks] == [c.stack for c in first.checks]
