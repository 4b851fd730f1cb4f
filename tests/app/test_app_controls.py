"""The explorer's controls never disagree with what it draws (issue 31): after a run that draws
nothing (an empty text, a Cancel, an error) the browser forgets the layer slider, the head box
and the token position; drawn again, each must show the value the page draws, not its default."""

from __future__ import annotations

import pytest
from apptest import TEXT, TINY, new_app, ok
from streamlit.testing.v1 import AppTest


def shown(at: AppTest) -> dict[str, object]:
    """What the browser shows in the three controls: the value a run sent with the widget, or,
    when it sent none, the widget's default (the browser has no value of its own for a widget
    the run before did not draw)."""
    layer = at.slider(key="layer").proto
    head = at.selectbox(key="head").proto
    tok = next(n for n in at.number_input if n.key == "tok").proto
    return {
        "layer": int(layer.value[0] if layer.set_value else layer.default[0]),
        "head": head.raw_value if head.set_value else head.options[head.default[0]],
        "tok": int(tok.value if tok.set_value else tok.default),
    }


DRAWN = {"layer": 1, "head": "head 2", "tok": 3}


def drawn(at: AppTest) -> dict[str, object]:
    """What the page draws: the session's values (the grid, the big head, the link)."""
    return {"layer": at.session_state["layer"], "head": f"head {at.session_state['head']}",
            "tok": at.session_state["tok"]}  # fmt: skip


def test_controls_show_the_drawn_view_after_an_empty_text(env):
    at = new_app(model=TINY, text=TEXT, layer=1, head=2, tok=3, tview="text").run()
    ok(at)
    assert shown(at) == drawn(at) == DRAWN
    at.text_area(key="text").set_value("").run()
    assert "Type a text" in at.info[0].value
    at.text_area(key="text").set_value(TEXT).run()
    ok(at)
    assert drawn(at) == DRAWN and at.query_params["layer"] in ("1", ["1"])
    assert shown(at) == DRAWN


def test_controls_show_the_drawn_view_after_a_cancel(env, monkeypatch: pytest.MonkeyPatch):
    """The issue's repro: a link at layer 1 / head 2 / token 3, a new text cancelled, run again."""
    from ui import progress

    monkeypatch.setattr(progress, "_key", lambda run_key: "this-run")
    at = new_app(model=TINY, text=TEXT, layer=1, head=2, tok=3, tview="text").run()
    ok(at)
    at.session_state["_attnviz_cancelled"] = "this-run"
    at.text_area(key="text").set_value(TEXT + " and the sea").run()
    assert any("Cancelled" in str(i.value) for i in at.info) and not at.get("plotly_chart")
    next(b for b in at.button if b.label == "Run again").click().run()
    ok(at)
    assert drawn(at) == DRAWN
    assert shown(at) == DRAWN


def test_a_text_past_the_models_positions_is_named_up_front_with_an_offer(env):
    """tiny:bert reads 512 positions (minilm-l6's limit): the sidebar says so (not the server's
    8192), a longer text gets the reason before any forward, and a button runs its first 512."""
    import attnviz

    calls: list[int] = []
    real = attnviz.extract
    env.setattr(attnviz, "extract", lambda lm, text, **k: calls.append(1) or real(lm, text, **k))
    at = new_app(model="tiny:bert", text="river bank " * 300).run()
    assert not at.exception
    assert any("Up to 512 tokens (the model's own position limit)" in c.value for c in at.sidebar.caption)
    assert "reads at most 512 positions" in at.error[0].value and calls == []
    assert not at.get("progress") and not at.get("plotly_chart")
    next(b for b in at.button if b.label == "Use the first 512 tokens").click().run()
    ok(at)
    assert calls == [1] and at.get("plotly_chart")
    assert len(at.dataframe[0].value["token"]) == 512
