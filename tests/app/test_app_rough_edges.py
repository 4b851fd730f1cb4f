"""The rough edges a newcomer hit (issue 26), each pinned by a test that fails without its fix:
pages run in AppTest on the tiny models (conftest serves them)."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
from apptest import TEXT, TINY, elements, mounted, new_app, ok, prepare, specs
from streamlit.testing.v1 import AppTest

import attnviz

OVERVIEW = "pages/1_Model_overview.py"
SCRATCH = "pages/2_From_scratch.py"
COMPARE = "pages/3_Compare.py"
GENERATION = "pages/4_Generation.py"


@pytest.fixture
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path))
    return prepare(monkeypatch)


def grid_of(at: AppTest) -> dict:
    return next(s for s in specs(at) if sum(t.get("type") == "heatmap" for t in s["data"]) > 1)


def test_a_refused_text_leaves_no_running_bar(env):
    """Over the cap: the error, and no "starting the forward pass…" bar or Cancel button under it."""
    env.setenv("ATTNVIZ_MAX_TOKENS", "8")
    at = new_app(model=TINY, text="the bank of the river " * 5).run()
    assert "Shorten the text" in at.error[0].value
    assert not at.get("progress")
    assert not [b for b in at.button if (b.key or "").startswith("cancel_")]


def test_a_paste_past_the_limit_is_named_not_dropped(env):
    """The text box takes any paste (a max_chars box drops it silently in the browser) and the
    page says what is wrong."""
    from ui.params import MAX_TEXT_CHARS

    at = new_app(model=TINY, text=TEXT).run()
    assert at.text_area(key="text").proto.max_chars == 0
    at.text_area(key="text").set_value("a" * (MAX_TEXT_CHARS + 10_000)).run()
    assert not at.exception
    assert f"{MAX_TEXT_CHARS + 10_000:,} characters" in at.error[0].value


def test_tokens_are_readable_text_never_byte_spellings(env):
    """Emoji and CJK through a byte-level BPE: the table and the axes show the characters (a
    split character with its part), the pieces are listed, no byte-alphabet mojibake."""
    text = "I 😀 日本"
    at = new_app(model=TINY, text=text).run()
    ok(at)
    table = at.dataframe[0].value
    shown = list(table["token"])
    assert any(t.startswith("😀⟨1/") for t in shown) and any(t.startswith("日⟨") for t in shown)
    assert not any(ch in "".join(shown) for ch in "ðŁĺæĹ¥")
    assert any("F0" in p and "9F" in p for p in table["pieces"])
    axis = grid_of(at)["data"][0]["x"]
    assert any("😀⟨1/" in x for x in axis) and not any("ð" in x for x in axis)


def test_coloured_text_colour_bar_is_not_squashed(env):
    at = new_app(model=TINY, text=TEXT, tview="text").run()
    ok(at)
    bar = next(s for s in specs(at) if s["data"][0].get("type") == "bar")
    cb = bar["layout"]["coloraxis"]["colorbar"]
    assert cb["orientation"] == "h" and cb["lenmode"] == "pixels" and cb["len"] >= 200


def test_head_picker_names_heads_the_same_on_every_model(env):
    """A label with the KV head stayed on screen after a switch to a model without GQA."""
    at = new_app(model=TINY, text=TEXT).run()
    ok(at)
    assert all(re.fullmatch(r"head \d+", o) for o in at.selectbox(key="head").options)


def test_token_lines_open_on_the_last_token_with_its_lines(env):
    at = new_app(model=TINY, text=TEXT).run()
    ok(at)
    n = attnviz.extract(__import__("tiny").loaded("llama-gqa"), TEXT).n_tokens
    assert at.number_input(key="tok").value == n - 1
    lines = next(s for s in specs(at) if any(t.get("name") == "query tokens" for t in s["data"]))
    drawn = [sh for sh in lines["layout"].get("shapes", []) if sh.get("x1") == 1]  # one per link
    assert len({sh["y1"] for sh in drawn}) > 3  # lines to several keys, not one to itself


def test_compare_cautions_when_few_tokens_align(env):
    long_a = "the quick brown fox jumps over the lazy dog near the river bank " * 4
    at = new_app(COMPARE, model=TINY, text=long_a, text2="bank river").run()
    assert not at.exception
    assert any("tokens are aligned" in w.value for w in at.warning)
    at = new_app(COMPARE, model=TINY, text=long_a, text2=long_a.replace("lazy", "sleepy")).run()
    assert not [w for w in at.warning if "tokens are aligned" in w.value]


def test_a_link_full_of_garbage_gives_one_warning(env):
    bad = {"layer": "x", "head": "-3", "cmap": "", "hide": "maybe", "scale": "??", "tview": "nope"}
    at = new_app(model=TINY, text=TEXT, **bad).run()
    assert not at.exception
    assert len(at.warning) == 1
    msg = at.warning[0].value
    assert all(f"`{name}`" in msg for name in bad) and "an empty value" in msg


def test_from_scratch_shows_the_change_its_warning_names(env):
    at = new_app(SCRATCH, model=TINY, text=TEXT, change="garbage").run()
    assert not at.exception
    assert any("showing 'none'" in w.value for w in at.warning)
    assert at.segmented_control(key="change").value == "none"


def test_overview_lays_layers_out_the_same_way_for_every_model(env):
    """Columns are layers whatever the model's shape (two tiny models, more heads than layers
    and more layers than heads, used to swap)."""
    for model in (TINY, "tiny:gpt2"):
        at = new_app(OVERVIEW, model=model, text=TEXT).run()
        ok(at)
        assert any(c.value.startswith("Columns: layers, rows: heads") for c in at.caption)
        (mosaic,) = mounted(at, "attnviz_heatmaps")  # ui.heatmaps: a panel per head, row by row
        n_layers = attnviz.extract(__import__("tiny").loaded(model.split(":")[1]), TEXT).n_layers()
        assert mosaic["cols"] == n_layers and mosaic["panels"][1]["title"].startswith("L1 H0")


def test_flow_map_names_its_layer_axis(env):
    at = new_app(OVERVIEW, model=TINY, text=TEXT).run()
    ok(at)
    flow = next(s for s in specs(at) if "flow into" in (s["layout"].get("title") or {}).get("text", ""))
    assert "layer" in flow["layout"]["yaxis"]["title"]["text"]


def test_stepped_work_has_a_cancel_that_stops_it():
    """`progress.steps` (the overview's pooling): a Cancel button beside the bar; a click stops
    the run and the next run says it was cancelled instead of starting again."""

    def script() -> None:
        import streamlit as st

        from ui import progress

        key = ("pooling", 1)
        if progress.cancelled(key):
            st.stop()
        with progress.steps("Pooling the layers", key, unit="layer") as report:
            report(1, 3)
            st.stop()  # the run is interrupted here (by the click, in the app)

    at = AppTest.from_function(script).run()
    cancel = next(b for b in at.button if b.label == "Cancel")
    cancel.click().run()
    assert any("Cancelled" in i.value for i in at.info)


def test_generation_step_labels_quote_the_token(env):
    at = new_app(GENERATION, model=TINY, text=TEXT, k=3).run()
    ok(at)
    options = at.select_slider(key="gstep").options
    assert all(re.fullmatch(r"step \d+ · '.*'", o) for o in options), options


def test_share_box_does_not_promise_the_same_view_without_the_text(env):
    rng = random.Random(0)
    text = "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(30_000))  # incompressible
    at = new_app(model=TINY, text="short").run()
    at.text_area(key="text").set_value(text).run()
    assert not at.exception
    notes = [c.value for c in at.caption if "Opening this link" in c.value]
    assert notes and "same view" not in notes[-1] and "without the text" in notes[-1]


@pytest.mark.parametrize("missing", ["/definitely/not/a/folder/attnviz", "/etc"])
def test_a_path_that_is_no_model_says_the_same_whether_it_exists(env, missing):
    """Outside demo mode, "/etc: not a model folder" against "does not exist" told which server
    folders exist."""
    at = new_app(model=missing, text=TEXT).run()
    assert not at.exception
    said = at.error[0].value.replace(missing, "PATH")
    assert said.endswith("is not a model folder (a model folder holds config.json, .safetensors weights "
                         "and tokenizer files)"), said  # fmt: skip


def test_a_head_change_leaves_the_grid_as_it_was(env):
    """The grid's drawing does not depend on the head (the frame moves in the browser): a head
    change reruns only the big head's fragment and the grid is not sent again (tests/browser checks
    the browser keeps its drawing); here, even a full rerun gives the grid the same revision (the
    browser draws again only on a new one), and the big head a new one."""
    at = new_app(model=TINY, text=TEXT, head=0).run()
    ok(at)
    grid, head = elements(at)
    at.selectbox(key="head").set_value(2).run()
    ok(at)
    grid2, head2 = elements(at)
    assert grid2["rev"] == grid["rev"] and grid2["open"] == 2 and grid["open"] == 0
    assert head2["rev"] != head["rev"] and "· head 2" in head2["panels"][0]["title"]


def test_any_click_on_a_grid_tile_picks_its_head(env):
    """Every tile of the grid is one click target (the element sends the tile's index, whichever
    cell is clicked), one tile per head in head order."""
    at = new_app(model=TINY, text=TEXT).run()
    ok(at)
    grid = elements(at)[0]
    assert grid["click"] == "panel" and [p["title"] for p in grid["panels"]] == [
        f"head {h} · kv {h // 2}" for h in range(4)
    ]
    for h in (3, 1):
        at.session_state["head_grid"] = {"click": {"panel": h, "n": h}}
        at.run()
        assert at.selectbox(key="head").value == h and elements(at)[0]["open"] == h


def test_the_overview_reuses_the_explorers_result(env, monkeypatch):
    """A page switch does not run the model again for the same text."""
    from ui import models

    calls = []
    real = models.attnviz.extract
    monkeypatch.setattr(models.attnviz, "extract", lambda *a, **k: calls.append(k) or real(*a, **k))
    at = new_app(model=TINY, text=TEXT).run()
    ok(at)
    at.switch_page(OVERVIEW).run()
    ok(at)
    assert len([c for c in calls if not c.get("generate")]) == 1


def test_notebook_head_view_draws_every_token_of_a_short_text():
    """`head_view` pooled a 64-token text to 29×29 on the built-in model (all layers) and a
    longer one to 115×115 (one layer); on the tiny model (few heads) 200 tokens went to 128×128."""
    import tiny

    res = attnviz.extract(tiny.loaded("llama-gqa"), "the bank of the river " * 30)
    n = res.n_tokens
    assert 150 <= n <= 256
    for fig in (attnviz.head_view(res), attnviz.head_view(res, layer=1)):
        z = np.asarray(fig.data[0].z)
        assert z.shape == (n, n) and "pooled" not in fig.layout.title.text


ATLAS = "pages/5_Head_atlas.py"


def test_a_head_atlas_run_that_just_finished_is_not_from_the_disk_cache(env):
    at = new_app(ATLAS, model=TINY, ntexts=3).run()
    at.button(key="atlas_run").click().run()
    ok(at)
    notes = [c.value for c in at.caption if re.match(r"\d+ texts", c.value)]
    assert notes and "from the disk cache" not in notes[0] and re.search(r"\d+\.\d s", notes[0]), notes


def test_a_cancelled_head_atlas_says_so(env):
    """The rerun a Cancel click starts (the button reads True in it) says the run was cancelled."""
    at = new_app(ATLAS, model=TINY, ntexts=3).run()
    at.session_state["atlas_cancel"] = True
    at.run()
    assert not at.exception
    assert any("Cancelled" in i.value for i in at.info)
