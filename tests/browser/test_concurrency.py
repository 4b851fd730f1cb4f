"""Many people at once: 8 browser sessions on one real server, no cross-talk; one model load
however many sessions ask at the same time; switching models frees the old one."""

from __future__ import annotations

import gc
import re
import threading
import time
import urllib.parse
import weakref
from dataclasses import dataclass

import numpy as np
import pytest
from browser_page import TITLES_JS, alerts, charts, chromium, wait_idle
from ws_client import figure_array, run_session

import attnviz

pytestmark = pytest.mark.slow

SESSIONS = 8  # browser sessions at once
HEADLESS_SESSIONS = 24  # websocket sessions at once (no browser: the server is the bottleneck)
# Single tokens in SmolLM2's vocabulary (checked in test_headless_sessions...).
WORDS = [
    "apple",
    "river",
    "music",
    "garden",
    "window",
    "doctor",
    "summer",
    "pencil",
    "table",
    "mountain",
    "coffee",
    "letter",
    "forest",
    "bridge",
    "candle",
    "rabbit",
    "silver",
    "ocean",
    "engine",
    "basket",
    "ticket",
    "island",
    "jacket",
    "market",
]


def text_of(word: str) -> str:
    return f"the {word} was found near the old house"


@pytest.fixture(scope="module")
def smollm():
    return attnviz.load_model("smollm2-135m")


def head_chart(page, layer: int, head: int) -> dict:
    want = f"layer {layer} · head {head} "
    found = [c for c in charts(page) if c["traces"] == 1 and want in c["title"] + " "]
    assert found, f"no heatmap titled {want!r}: {[c['title'] for c in charts(page)]}"
    return found[0]


@dataclass
class Seen:
    word: str
    layer: int
    head: int
    alerts: list[str]
    chart: dict
    seconds: float  # from the first page open to this session's finished view


@pytest.fixture(scope="module")
def sessions(server) -> list[Seen]:
    """8 Chromium contexts open 8 share links at once (different texts, layers and heads), then
    each page is read once its view is drawn."""
    seen: list[Seen] = []
    with chromium() as browser:
        pages = []
        t0 = time.monotonic()
        for i, word in enumerate(WORDS[:SESSIONS]):
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            query = urllib.parse.urlencode({"text": text_of(word), "layer": 3 * i, "head": i % 9})
            page.goto(f"{server.url}/?{query}", wait_until="commit")
            pages.append(page)
        for i, (word, page) in enumerate(zip(WORDS, pages, strict=False)):
            wait_idle(page, timeout_ms=240_000)
            page.wait_for_function(
                f"t => ({TITLES_JS})().some(title => title.includes(t))",
                arg=f"layer {3 * i} · head {i % 9}",
                timeout=120_000,
            )
            chart = head_chart(page, 3 * i, i % 9)
            seen.append(Seen(word, 3 * i, i % 9, alerts(page), chart, time.monotonic() - t0))
    return seen


@pytest.mark.browser
def test_eight_sessions_each_see_only_their_own_text(server, sessions, smollm):
    """All 8 finish; each page's tick labels hold its own word and no other session's, and its
    head heatmap equals the engine's attention for its own text (max abs diff <= 1e-4)."""
    assert len(sessions) == SESSIONS
    for i, s in enumerate(sessions):
        assert not [a for a in s.alerts if "rror" in a], s.alerts
        labels = " ".join(s.chart["x"] + s.chart["y"])
        assert re.search(rf"\(\d+\) {s.word}\b", labels), labels
        others = [w for w in WORDS if w != s.word and re.search(rf"\) {w}\b", labels)]
        assert not others, f"session {i} shows other sessions' tokens {others}"
        expected = attnviz.extract(smollm, text_of(s.word)).head(s.layer, s.head)
        shown = np.array(s.chart["z"], dtype=np.float64)
        assert shown.shape == expected.shape
        assert np.abs(shown - expected).max() <= 1e-4
    assert server.alive()
    print(f"{SESSIONS} sessions finished after {', '.join(f'{s.seconds:.1f}' for s in sessions)} s")


def test_headless_sessions_at_once_see_only_their_own_text(server, smollm, sessions):
    """24 sessions over the websocket at the same moment (threads), each with its own word, layer
    and head: every head heatmap has its own word and no other, and equals the engine's attention."""
    assert len(WORDS) >= HEADLESS_SESSIONS
    for word in WORDS:
        assert len(attnviz.tokenize(smollm, text_of(word))[0]) == len(
            attnviz.tokenize(smollm, text_of("x"))[0]
        )
    runs: dict[int, object] = {}
    start = threading.Barrier(HEADLESS_SESSIONS, timeout=60)

    def visit(i: int) -> None:
        query = urllib.parse.urlencode({"text": text_of(WORDS[i]), "layer": i % 30, "head": i % 9})
        start.wait()
        runs[i] = run_session(server.url, query)

    t0 = time.monotonic()
    threads = [threading.Thread(target=visit, args=(i,)) for i in range(HEADLESS_SESSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    wall = time.monotonic() - t0
    assert len(runs) == HEADLESS_SESSIONS, "some sessions never finished"
    for i, run in sorted(runs.items()):
        assert run.status == "FINISHED_SUCCESSFULLY" and not run.exceptions, run
        heads = [t for f in run.figures for t in f["data"] if t.get("type") == "heatmap"]
        head = heads[-1]  # the single-head view is drawn last
        labels = " ".join(head["x"]) + " " + " ".join(head["y"])
        assert re.search(rf"\) {WORDS[i]}\b", labels), labels
        others = [w for w in WORDS if w != WORDS[i] and re.search(rf"\) {w}\b", labels)]
        assert not others, f"session {i} shows {others}"
        expected = attnviz.extract(smollm, text_of(WORDS[i])).head(i % 30, i % 9)
        shown = figure_array(head["z"]).astype(np.float64).reshape(expected.shape)
        assert np.abs(shown - expected).max() <= 1e-4
    print(f"{HEADLESS_SESSIONS} websocket sessions at once: all finished in {wall:.1f} s")


def test_server_logs_one_line_per_extraction(server, sessions):
    """The running server writes attnviz's `extract model=... tokens=... path=... seconds=...` line
    (needs logging configured for the `attnviz` logger in the app)."""
    log = server.log()
    lines = re.findall(r"extract model=smollm2-135m tokens=\d+ path=\w+ seconds=[\d.]+", log)
    assert lines, "the server log has no extraction lines:\n" + log[-1500:]


def test_model_loaded_once_under_concurrent_sessions(server, sessions):
    """8 sessions asked for smollm2-135m at the same moment: one load (logger attnviz.loading)."""
    loads = re.findall(r"loaded smollm2-135m \(", server.log())
    assert len(loads) == 1, f"{len(loads)} loads:\n{server.log()[-1500:]}"


# -- in process: AppTest sessions in threads, counted loads, freed models -----------------------
def one_runtime_for_threaded_apptests(monkeypatch) -> None:
    """A real server has one Streamlit Runtime for all its sessions; AppTest instead puts a mock
    Runtime into the process-wide `Runtime._instance` at the start of each run and sets it back to
    None at the end. AppTests run in threads therefore take the singleton from under each other:
    a session still running finds no Runtime (`RuntimeError: Runtime hasn't been created!`) or
    another session's component registry (the Explorer's `st.components.v2` heatmaps mount
    on every run). Here every AppTest run shares one mock Runtime, as sessions share the server's:
    AppTest's own swaps go to a subclass's attribute, leaving the singleton set for all threads."""
    from unittest.mock import MagicMock

    import streamlit.testing.v1.app_test as app_test
    from streamlit.components.v2.component_manager import BidiComponentManager
    from streamlit.runtime import Runtime
    from streamlit.runtime.caching.storage.dummy_cache_storage import MemoryCacheStorageManager
    from streamlit.runtime.dataframe_source_manager import DataframeSourceManager
    from streamlit.runtime.media_file_manager import MediaFileManager
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

    shared = MagicMock(spec=Runtime)
    shared.media_file_mgr = MediaFileManager(MemoryMediaFileStorage("/mock/media"))
    shared.dataframe_source_mgr = DataframeSourceManager()
    shared.cache_storage_manager = MemoryCacheStorageManager()
    shared.bidi_component_registry = BidiComponentManager()
    shared.bidi_component_registry.discover_and_register_components(start_file_watching=False)

    class PerRunRuntime(Runtime):
        """What AppTest._run assigns `_instance` on (its module's name `Runtime`)."""

    monkeypatch.setattr(Runtime, "_instance", shared)
    monkeypatch.setattr(app_test, "Runtime", PerRunRuntime)


def test_one_load_for_many_simultaneous_sessions(monkeypatch):
    """8 AppTest sessions in 8 threads ask for the same (new) model at once; the loader runs once
    and every session gets that one model object. The loader holds until all 8 sessions have
    asked the model cache (a condition, not a sleep), so a second load has every chance to start."""
    from streamlit.testing.v1 import AppTest

    from ui import models

    calls: list[str] = []
    asked: list[int] = []  # one entry per session that called the model cache
    got: list[int] = []  # id() of the LoadedModel each call returned
    everyone = threading.Condition()
    gate = threading.Barrier(SESSIONS, timeout=60)
    real_load, real_cached = models._load_uncached, models._cached_model

    def load_when_all_asked(ms, token):
        calls.append(ms.spec)
        with everyone:
            assert everyone.wait_for(lambda: len(asked) >= SESSIONS, timeout=120), (
                f"only {len(asked)} of {SESSIONS} sessions asked for the model"
            )
        return real_load(ms, token)

    def counted(*args):
        with everyone:
            asked.append(1)
            everyone.notify_all()
        lm = real_cached(*args)
        got.append(id(lm))
        return lm

    monkeypatch.setattr(models, "_load_uncached", load_when_all_asked)
    monkeypatch.setattr(models, "_cached_model", counted)
    one_runtime_for_threaded_apptests(monkeypatch)
    spec = "tiny:gpt2"
    errors: list[str] = []

    def session(i: int) -> None:
        at = AppTest.from_file(str(models.__file__).replace("ui/models.py", "app.py"), default_timeout=180)
        at.query_params.update({"model": spec, "text": text_of(WORDS[i])})
        gate.wait()
        at.run()
        if at.exception or at.error:
            errors.append(f"{i}: {[e.value for e in at.exception]} {[e.value for e in at.error]}")

    threads = [threading.Thread(target=session, args=(i,)) for i in range(SESSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not errors, errors
    assert calls == [spec], f"loaded {len(calls)} times"
    assert len(got) >= SESSIONS and len(set(got)) == 1, "sessions got different model objects"


def test_switching_models_frees_the_old_one(monkeypatch):
    """The model cache is bounded (ui.models.MAX_MODELS): after switching through more models than
    that, the first model object is garbage (weakref dead), and with CUDA its memory is back."""
    import tiny
    import transformers
    from streamlit.testing.v1 import AppTest

    from ui import models

    loaded: list[weakref.ref] = []

    def fresh(ms, token):
        """A new tiny model per load (not tests/tiny.py's cached one), so only the app holds it."""
        spec = ms.spec
        arch = spec.removeprefix("tiny:")
        model = transformers.AutoModelForCausalLM.from_config(tiny.configs()[arch]).eval()
        loaded.append(weakref.ref(model))
        return attnviz.wrap_model(model, tiny.tokenizer(), spec=spec)

    monkeypatch.setattr(models, "_load_uncached", fresh)
    models._cached_model.clear()
    at = AppTest.from_file(str(models.__file__).replace("ui/models.py", "app.py"), default_timeout=120)
    order = ["tiny:llama-gqa", "tiny:qwen3", "tiny:mistral-sliding", "tiny:gemma2"][: models.MAX_MODELS + 1]
    at.query_params.update({"model": order[0], "text": "the bank of the river"})
    at.run()
    for spec in order[1:]:
        at.text_input(key="model_custom").set_value(spec).run()
        assert not at.exception and not at.error, [e.value for e in at.error]
    del at
    gc.collect()
    assert len(loaded) == len(order)
    assert loaded[0]() is None, "the first model is still referenced after switching away"
    assert loaded[-1]() is not None, "the current model should stay cached"
    models._cached_model.clear()


@pytest.mark.gpu
def test_switching_models_returns_gpu_memory():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    lm = attnviz.load_model("smollm2-135m", device="cuda")
    attnviz.extract(lm, "the bank of the river")
    used = torch.cuda.memory_allocated()
    assert used > 100 * 2**20
    ref = weakref.ref(lm.model)
    lm.release()
    del lm
    gc.collect()
    torch.cuda.empty_cache()
    assert ref() is None or torch.cuda.memory_allocated() < 16 * 2**20
    assert torch.cuda.memory_allocated() < used / 4
