"""Fault injection through the app (AppTest): a damaged cache of the built-in model is rebuilt and
the page says so above its charts (the engine side: tests/engine/test_faults.py)."""

from __future__ import annotations

from apptest import TEXT, new_app, ok
from faults import TinyConverter

from attnviz.loading import convert


def test_the_app_shows_that_it_rebuilt_a_damaged_cache(env, tmp_path):
    monkeypatch = env
    cache = tmp_path / "cache"
    monkeypatch.setenv("ATTNVIZ_CACHE", str(cache))
    conv = TinyConverter(tmp_path).install(monkeypatch.setattr)
    convert.smollm(cache / "smollm2-135m")
    with open(cache / "smollm2-135m" / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    at = new_app(model="smollm2-135m", text=TEXT).run()
    ok(at)
    notes = [w.value.replace("\\", "") for w in at.warning]  # Markdown-escaped for the page
    assert any(
        "smollm2-135m" in n and "is damaged: model.safetensors is 1,000 bytes" in n and "rebuilding it" in n
        for n in notes
    ), notes
    assert conv.calls == 2 and at.get("plotly_chart"), "rebuilt, and the page drew its charts"
    assert convert.damage(cache / "smollm2-135m") is None
