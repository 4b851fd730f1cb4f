"""The progress line of a long extraction (ui/progress.py): stages, elapsed time, time left."""

from ui.progress import stage_text


def test_stage_text_counts_layers_and_estimates_what_is_left():
    assert stage_text("Running m", 0, 30, 0.4) == "Running m: forward pass, attention layer 0 of 30 · 0 s"
    # 10 of 30 layers in 20 s: 2 s a layer, 20 layers left
    assert stage_text("Running m", 10, 30, 20.0) == (
        "Running m: forward pass, attention layer 10 of 30 · 20 s, about 40 s left"
    )
    assert "checking one layer of each stack against eager" in stage_text("Running m", 30, 30, 61.0)


def test_a_cancelled_run_stays_cancelled_until_run_again(monkeypatch):
    """Cancel (a click during the forward) leaves the page saying so, with nothing extracted;
    "Run again" runs the same text and draws it."""
    from apptest import TINY, new_app, ok

    import attnviz
    from ui import progress

    monkeypatch.setenv("ATTNVIZ_DEMO", "0")
    monkeypatch.setattr(progress, "_key", lambda run_key: "this-run")
    calls: list[str] = []
    real = attnviz.extract
    monkeypatch.setattr(attnviz, "extract", lambda *a, **k: calls.append("run") or real(*a, **k))
    at = new_app(model=TINY, text="a text that was cancelled")
    at.session_state["_attnviz_cancelled"] = "this-run"
    at.run()
    ok(at)
    assert any("Cancelled" in str(i.value) for i in at.info) and not at.get("plotly_chart")
    assert calls == []
    next(b for b in at.button if b.label == "Run again").click().run()
    ok(at)
    assert calls == ["run"] and at.get("plotly_chart")


def test_the_bar_is_redrawn_at_most_once_a_second_but_always_first_and_last(monkeypatch):
    """Each redraw is a message the browser renders while the forward runs on the same cores:
    of a forward's 30 layers, the first and the last report are drawn, and one per second."""
    from streamlit.delta_generator import DeltaGenerator

    from ui import progress

    texts: list[str] = []
    real = DeltaGenerator.progress

    def drawn(self, value, text=None):
        texts.append(text)
        return real(self, value, text)

    monkeypatch.setattr(DeltaGenerator, "progress", drawn)
    clock = iter(0.25 * i for i in range(1000))  # each layer takes 1/4 s
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    with progress.staged("Running m", 1500, "run") as report:
        for done in range(31):
            report(done, 30)
    layers = [int(t.split("attention layer ")[1].split()[0]) for t in texts if "attention layer" in t]
    assert progress.REDRAW_EVERY == 1.0
    assert layers == list(range(0, 30, 4)), texts  # one redraw per second of forward
    assert "forward pass done" in texts[-1]
