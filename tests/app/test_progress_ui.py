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
