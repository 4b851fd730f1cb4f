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


def badges(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown if "-badge[" in m.value]


def test_the_layer_on_screen_says_whether_it_is_exact(env):
    """Short text: the extraction checked the middle layer (1 of 3): it says so with its figure;
    layer 0 was not checked, says why and checks it on a click."""
    at = new_app(model=TINY, text=TEXT, layer=1).run()
    ok(at)
    assert any("exact] Layer 1 equals transformers' eager" in b and "float32" in b for b in badges(at))
    at.slider(key="layer").set_value(0).run()
    ok(at)
    assert any("not checked] Layer 0 was not compared" in b for b in badges(at)), badges(at)
    next(b for b in at.button if b.label == "Check layer 0").click().run()
    ok(at)
    (line,) = [b for b in badges(at) if "Layer 0" in b]
    assert "exact] Layer 0 equals" in line and "max |Δ|" in line


def test_past_the_auto_check_the_page_says_it_was_skipped_and_offers_it(env):
    import sys

    # a short text stands for a 1,500-token one
    env.setattr(sys.modules["attnviz.extract"], "AUTO_VERIFY_TOKENS", 4)
    at = new_app(model=TINY, text=TEXT, layer=1).run()
    ok(at)
    (line,) = badges(at)
    assert "not checked] Layer 1" in line and "past 4 tokens the automatic check is skipped" in line
    next(b for b in at.button if b.label == "Check layer 1").click().run()
    ok(at)
    assert "exact] Layer 1 equals" in badges(at)[0]


def test_the_progress_line_says_the_check_is_skipped_past_the_auto_limit(monkeypatch):
    """At 1,500 tokens the bar's last line says the check is skipped, not "checking one layer"."""
    from streamlit.delta_generator import DeltaGenerator

    from ui import progress

    texts: list[str] = []
    real = DeltaGenerator.progress

    def drawn(self, value, text=None):
        texts.append(text)
        return real(self, value, text)

    monkeypatch.setattr(DeltaGenerator, "progress", drawn)
    for n in (1500, 100):
        with progress.staged("Running m", n, "run") as report:
            report(30, 30)
    long, short = [t for t in texts if "forward pass done" in t]
    assert "checking" not in long and "automatic check is skipped" in long, long
    assert "checking one layer of each stack against eager" in short, short


def colourbar(spec: dict) -> str:
    return spec["layout"]["coloraxis"]["colorbar"]["title"]["text"]


def test_value_weighted_says_what_its_colour_is_and_the_page_says_how_to_read(env):
    from apptest import specs

    at = new_app(model=TINY, text=TEXT, layer=1, head=2).run()
    ok(at)
    assert any("row = query" in c.value and "column = key" in c.value for c in at.caption)
    assert {colourbar(s) for s in specs(at) if s["data"][0].get("type") == "heatmap"} == {"weight"}
    at.toggle(key="vw").set_value(True).run()
    ok(at)
    heat = [s for s in specs(at) if s["data"][0].get("type") == "heatmap"]
    assert len(heat) == 2 and all(colourbar(s).startswith("‖α·W_O v‖") for s in heat)
    assert all("‖α·W_O v‖" in s["data"][0]["hovertemplate"] for s in heat)


def test_links_per_head_travels_in_the_share_link(env):
    at = new_app(model=TINY, text=TEXT, topk=5).run()
    ok(at)
    assert at.number_input(key="topk").value == 5 and at.query_params["topk"] in ("5", ["5"])
    at.number_input(key="topk").set_value(2).run()
    ok(at)
    assert at.query_params["topk"] in ("2", ["2"])


def test_model_overview_names_no_head_before_a_row_is_picked(env):
    at = new_app("pages/1_Model_overview.py", model=TINY, text=TEXT).run()
    ok(at)
    button = at.button(key="open_head")
    assert button.disabled and "Open layer" not in button.label, button.label
    at.session_state["head_table"] = {"selection": {"rows": [1], "columns": []}}
    at.run()
    table = at.dataframe[0].value
    want = f"Open layer {int(table['layer'].iloc[1])}, head {int(table['head'].iloc[1])}"
    assert at.button(key="open_head").label.startswith(want) and not at.button(key="open_head").disabled


def test_generation_says_the_tokens_to_generate_count_against_the_cap(env):
    at = new_app("pages/4_Generation.py", model=TINY, text=TEXT, k=2).run()
    ok(at)
    assert any("count together against the sidebar's token limit" in c.value for c in at.caption)
    assert "count against the token limit" in at.number_input(key="k").help


def test_from_scratch_names_its_steps_and_axes_and_scales_the_weights(env):
    at = new_app("pages/2_From_scratch.py", model=TINY, text=TEXT, layer=1, head=2).run()
    ok(at)
    options = at.radio(key="wstep").options
    assert (
        "q_view — Q split into heads" in " ".join(options)
        and "probs — attention weights (softmax)"
        in options[[o.split(" ", 2)[1] for o in options].index("probs")]
    )
    from apptest import labels

    n = len(labels(TEXT))
    shapes = [c.value for c in at.caption if c.value.startswith("Shape:")]
    assert shapes == [f"Shape: batch 1 × heads 4 × query tokens {n} × key tokens {n}."], shapes
    assert at.selectbox(key="scale").value == "auto"
    at.selectbox(key="scale").set_value("log").run()
    ok(at)
    assert at.query_params["scale"] in ("log", ["log"])
    at.radio(key="wstep").set_value("k_view").run()
    ok(at)
    shapes = [c.value for c in at.caption if c.value.startswith("Shape:")]
    assert shapes[0].startswith("Shape: batch 1 × tokens") and "kv heads 2 × head_dim 16" in shapes[0], shapes


def test_the_tokens_table_has_no_checkboxes(env):
    """Flags are shown as ticks: a boolean column is drawn as checkboxes that look editable."""
    at = new_app(model=TINY, text=TEXT).run()
    ok(at)
    table = at.dataframe[0].value
    assert table["special"].dtype != bool and set(table["special"]) <= {"✓", ""}
    assert table["special"].iloc[0] == "✓"  # <s>


def test_coloured_text_uses_the_heatmaps_colour_map(env):
    from apptest import specs

    at = new_app(model=TINY, text=TEXT, tview="text", cmap="Magma").run()
    ok(at)
    heat = next(s for s in specs(at) if s["data"][0].get("type") == "heatmap")
    bar = next(s for s in specs(at) if s["data"][0].get("type") == "bar")
    assert bar["layout"]["coloraxis"]["colorscale"] == heat["layout"]["coloraxis"]["colorscale"]
    fonts = bar["data"][0]["textfont"]["color"]
    assert "#fff" in fonts  # Magma starts dark: low weights get light text


def test_a_text_over_the_servers_cap_is_refused_with_an_offer(env):
    env.setenv("ATTNVIZ_MAX_TOKENS", "8")
    at = new_app(model=TINY, text=TEXT + " and the sea").run()
    msg = at.error[0].value
    assert msg.startswith("The text has") and "reads at most 8" in msg and "Shorten the text" in msg
    next(b for b in at.button if b.label == "Use the first 8 tokens").click().run()
    ok(at)
    assert len(at.dataframe[0].value["token"]) <= 8 and at.get("plotly_chart")


def test_the_page_shell_is_drawn_before_the_heavy_imports():
    """A fresh server's first visitor saw a blank page while torch and transformers imported:
    app.py sets the page up and says it is starting before it imports them."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).resolve().parents[2] / "app.py").read_text())
    heavy = min(
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module in ("ui", "attnviz.server")
    )
    calls = {getattr(n.func, "attr", ""): n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert calls["set_page_config"] < heavy and calls["info"] < heavy


def test_a_value_the_browser_sent_is_not_sent_back(env):
    """A run must not send back the value the user just chose as "set the widget to this": on a
    loaded server it arrives after further key presses (→ on the layer slider) and puts the slider
    back, so the presses after it count from there (the browser test lost one of seven). The
    value is still drawn, and the controls the user did not touch keep being re-sent (the case
    above: a widget the browser forgot)."""
    at = new_app(model=TINY, text=TEXT, layer=0, head=0).run()
    ok(at)
    at.slider(key="layer").set_value(2).run()
    ok(at)
    assert not at.slider(key="layer").proto.set_value
    assert at.session_state["layer"] == 2 and at.query_params["layer"] in ("2", ["2"])
    assert at.selectbox(key="head").proto.set_value  # untouched: re-sent as before
    at.selectbox(key="head").set_value(3).run()
    ok(at)
    assert not at.selectbox(key="head").proto.set_value
    assert at.slider(key="layer").proto.set_value and at.slider(key="layer").value == 2
    assert at.session_state["head"] == 3
    from apptest import specs

    assert any("layer 2 · head 3" in (s["layout"].get("title") or {}).get("text", "") for s in specs(at))
