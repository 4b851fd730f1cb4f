"""Issue 34 through AppTest on a demo server (ATTNVIZ_DEMO=1, the tiny model allowed): the
queue's messages (position with an estimate, a full queue with Retry), Compare queueing once for
two texts, the Head atlas's demo limits and the limits shown on the page."""

from __future__ import annotations

import threading

import pytest
from apptest import TINY, new_app, ok, prepare
from gate_helpers import hold, until

from attnviz.server.gate import InferenceGate
from attnviz.server.settings import DEMO_ATLAS_TEXTS

TEXT = "the bank of the river"


@pytest.fixture
def demo(monkeypatch, tmp_path):
    prepare(monkeypatch)
    monkeypatch.setenv("ATTNVIZ_DEMO", "1")
    monkeypatch.setenv("ATTNVIZ_ALLOWED_MODELS", TINY)
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path))
    monkeypatch.delenv("ATTNVIZ_RAY_ADDRESS", raising=False)
    return monkeypatch


def the_gate() -> InferenceGate:
    from ui import gate

    return gate.shared()


def wait_lines(demo) -> list[str]:
    """Every position line the page draws while it waits (`ui.gate.wait_text`), in order."""
    from ui import gate

    seen: list[str] = []
    real = gate.wait_text

    def spy(pos: int, est: float | None) -> str:
        seen.append(real(pos, est))
        return seen[-1]

    demo.setattr(gate, "wait_text", spy)
    return seen


def test_the_demo_limits_show_on_the_page(demo):
    at = new_app(model=TINY, text=TEXT).run()
    ok(at)
    banner = [i.value for i in at.info if str(i.value).startswith("Public demo:")]
    assert banner and "512 tokens" in banner[0] and "120 s per run" in banner[0] and "16 waiting" in banner[0]


def test_a_full_queue_says_so_and_offers_retry(demo):
    demo.setenv("ATTNVIZ_QUEUE_MAX", "1")
    gate = the_gate()
    holder, release = hold(gate)
    queued = threading.Event()
    waiter = threading.Thread(
        target=lambda: gate.turn(on_wait=lambda p: queued.set(), poll_seconds=0.01).__enter__(), daemon=True
    )
    waiter.start()
    assert queued.wait(5)
    at = new_app(model=TINY, text=TEXT).run()
    assert not at.exception
    assert any("queue is full" in str(w.value) for w in at.warning), [w.value for w in at.warning]
    assert at.button(key="attnviz_queue_retry").label == "Retry"
    assert not at.get("plotly_chart")  # nothing ran
    release.set()
    holder.join(5)
    waiter.join(5)
    until(lambda: gate.waiting == 0 and gate.status().running_for is None)
    at.button(key="attnviz_queue_retry").click().run()  # retry: it runs now
    ok(at)
    assert at.get("plotly_chart")


def test_a_waiting_visitor_sees_position_and_estimate_then_runs(demo):
    seen = wait_lines(demo)
    new_app(model=TINY, text="warm the model and the run times").run()  # a first run: an estimate exists
    gate = the_gate()
    _holder, release = hold(gate)
    at = new_app(model=TINY, text=TEXT)
    done = threading.Event()

    def visitor() -> None:
        at.run()
        done.set()

    threading.Thread(target=visitor, daemon=True).start()
    until(lambda: len(seen) >= 2)  # redrawn at every poll while it waits
    assert gate.waiting == 1
    release.set()
    assert done.wait(60)
    ok(at)
    assert at.get("plotly_chart")
    assert seen[0].startswith("⏳ Busy: 1 request is ahead of yours. Estimated wait: about ")
    until(lambda: gate.waiting == 0 and gate.status().running_for is None)


def test_compare_queues_once_for_both_texts(demo):
    calls: list[int] = []
    real = InferenceGate._enqueue

    def counted(self, *a, **kw):
        calls.append(1)
        return real(self, *a, **kw)

    demo.setattr(InferenceGate, "_enqueue", counted)
    new_app(model=TINY, text=TEXT).run()  # the model is loaded
    calls.clear()
    at = new_app("pages/3_Compare.py", model=TINY, text=TEXT, text2="another text to compare").run()
    ok(at)
    assert at.get("plotly_chart")
    assert len(calls) == 1, calls  # both texts ran in one turn


def test_head_atlas_in_the_demo_has_a_capped_corpus_no_uploads_and_no_ray(demo):
    demo.setenv("ATTNVIZ_RAY_ADDRESS", "head-node:6379")
    at = new_app("pages/5_Head_atlas.py", model=TINY, ntexts=2).run()
    ok(at)
    assert not at.get("file_uploader")
    keys = [w.key for w in at.get("button_group")]
    assert "atlas_source" not in keys and "atlas_engine" not in keys
    assert at.slider(key="ntexts").max == DEMO_ATLAS_TEXTS


def test_an_engine_wait_shows_the_position_on_the_page(demo):
    """The Head atlas's texts each take the model's lock (the gate's, in the demo) inside the
    engine, with no turn of the page's own: the page still shows the position while it waits,
    clears it when the turn starts, and the atlas is drawn."""
    seen = wait_lines(demo)
    at = new_app("pages/5_Head_atlas.py", model=TINY, ntexts=1).run()  # the model loads
    ok(at)
    gate = the_gate()
    _holder, release = hold(gate)
    done = threading.Event()

    def visitor() -> None:
        at.button(key="atlas_run").click().run()
        done.set()

    threading.Thread(target=visitor, daemon=True).start()
    until(lambda: len(seen) >= 2)
    assert gate.waiting == 1 and seen[0].startswith("⏳ Busy: 1 request is ahead of yours.")
    release.set()
    assert done.wait(120)
    ok(at)
    assert at.get("arrow_data_frame") or at.dataframe, "the atlas table"
    assert not any("ahead of yours" in str(i.value) for i in at.info)  # cleared once it ran
    until(lambda: gate.waiting == 0 and gate.status().running_for is None)
