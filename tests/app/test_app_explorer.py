"""Explorer page (app.py) through Streamlit's AppTest: figures, share links, options, errors.

Most tests run on the tiny random models of tests/tiny.py, which conftest.py registers with the
engine as ``tiny:<arch>`` specs. Tests marked slow use the real built-in model. The page helpers
are in apptest.py; the result cache's tests in test_app_cache.py, share links in test_app_share.py.
"""

from __future__ import annotations

import html
import io
import json

import numpy as np
import pytest
from apptest import (
    ROOT,
    TEXT,
    TIMEOUT,
    TINY,
    elements,
    engine,
    heatmaps,
    labels,
    new_app,
    ok,
    payload_bytes,
    share_link,
    specs,
    titled,
    z_of,
)
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz import figures as F

# -- what the page shows -----------------------------------------------------------------------


def test_grid_has_one_heatmap_per_head_and_token_axes(env):
    at = new_app(model=TINY, text=TEXT).run()
    ok(at)
    grid = specs(at)[0]
    assert len(heatmaps(grid)) == 4  # tiny llama: 4 query heads
    titles = [a["text"] for a in grid["layout"]["annotations"]]
    assert titles[:4] == ["head 0 · kv 0", "head 1 · kv 0", "head 2 · kv 1", "head 3 · kv 1"]
    head = titled(at, "layer 0 · head 0 ")
    trace = heatmaps(head)[0]
    assert trace["y"] == trace["x"] == labels(TEXT)
    assert np.allclose(z_of(trace).sum(-1), 1.0, atol=1e-5)
    import tiny

    assert list(at.dataframe[0].value["token"]) == list(
        attnviz.extract(tiny.loaded("llama-gqa"), TEXT).tokens.display
    )


@pytest.mark.slow
def test_default_view_is_the_builtin_model_on_the_bank_sentence(env):
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    ok(at)
    assert at.text_area(key="text").value == "the financial bank is located on river bank"
    assert at.selectbox(key="model_choice").value == attnviz.DEFAULT_MODEL
    shown = at.selectbox(key="model_choice").options  # "name — description", built-ins first
    assert [o.split(" — ")[0] for o in shown[:2]] == list(attnviz.BUILTIN_MODELS)
    grid = specs(at)[0]
    assert len(heatmaps(grid)) == 9  # SmolLM2: 9 query heads, 3 KV heads
    assert [a["text"] for a in grid["layout"]["annotations"]][4] == "head 4 · kv 1"
    trace = heatmaps(titled(at, "smollm2-135m · layer 0 · head 0 "))[0]
    assert trace["y"][:3] == ["(0) the", "(1) financial", "(2) bank"] and trace["y"][7] == "(7) bank"
    assert at.query_params["model"] == "smollm2-135m" and at.query_params["layer"] == "0"


def test_share_link_restores_layer_head_and_options(env):
    at = new_app(model=TINY, text=TEXT, layer=2, head=3, cmap="Magma", scale="log").run()
    ok(at)
    assert not at.warning
    assert at.slider(key="layer").value == 2 and at.selectbox(key="head").value == 3
    assert at.selectbox(key="cmap").value == "Magma" and at.selectbox(key="scale").value == "log"
    head = titled(at, "layer 2 · head 3 ")
    assert "log" in heatmaps(head)[0]["hovertemplate"]
    # the numbers drawn are the engine's layer 2, head 3 (not layer 0 / head 0 under this title)
    want = engine(TEXT).layer(2)
    logged = np.log10(np.maximum(want, 1e-5))  # log colour: log10 of the weight, floored at 1e-5
    np.testing.assert_allclose(z_of(heatmaps(head)[0]), logged[3], atol=1e-5)
    grid = heatmaps(specs(at)[0])
    for h in range(4):
        np.testing.assert_allclose(z_of(grid[h]), logged[h], atol=1e-5)
    assert np.abs(want[3] - engine(TEXT).layer(0)[0]).max() > 1e-2  # a wrong head would show
    assert at.query_params["layer"] == "2" and at.query_params["head"] == "3"
    assert "layer=2" in share_link(at) and "head=3" in share_link(at)  # the share link


def test_the_url_follows_the_widgets(env):
    at = new_app(model=TINY, text=TEXT).run()
    at.slider(key="layer").set_value(1).run()
    at.selectbox(key="head").set_value(2).run()
    ok(at)
    assert at.query_params["layer"] == "1" and at.query_params["head"] == "2"
    assert at.query_params["model"] == TINY and at.query_params["text"] == TEXT
    head = titled(at, "layer 1 · head 2 ")
    np.testing.assert_allclose(z_of(heatmaps(head)[0]), engine(TEXT).layer(1)[2], atol=1e-6)


def test_layer_head_and_colour_changes_never_rerun_the_model(env):
    calls = []
    real = attnviz.extract

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    env.setattr(attnviz, "extract", counting)
    at = new_app(model=TINY, text="a quick brown fox").run()
    for change in (
        lambda: at.slider(key="layer").set_value(2),
        lambda: at.selectbox(key="head").set_value(1),
        lambda: at.selectbox(key="cmap").set_value("Blues"),
        lambda: at.selectbox(key="scale").set_value("log"),
        lambda: at.toggle(key="hide").set_value(True),
    ):
        change().run()
        ok(at)
    assert calls == ["a quick brown fox"]
    titled(at, "layer 2 · head 1 ")


def test_each_run_works_out_the_drawing_once(env):
    """The layer's controls resolve to one `Drawing` per run: the big head's fragment, called
    inside the layer's run, reuses it; a head-only rerun (the fragment alone) works out its own.
    Counted at its one call into `ui.shown.value_weighted`."""
    from ui import shown

    calls = []
    real = shown.value_weighted

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    env.setattr(shown, "value_weighted", counting)
    at = new_app(model=TINY, text="a quick brown fox").run()
    ok(at)
    assert len(calls) == 1  # the whole page: the layer fragment and the head fragment inside it
    for change in (
        lambda: at.selectbox(key="head").set_value(1),
        lambda: at.slider(key="layer").set_value(2),
        lambda: at.toggle(key="hide").set_value(True),
    ):
        calls.clear()
        change().run()
        ok(at)
        assert len(calls) == 1
    titled(at, "layer 2 · head 1 ")


def test_a_first_load_resolves_the_model_name_once(env):
    """A page run that loads a model resolves its name once (`specs.resolve`: the allow-list, the
    name's form, where it comes from) and loads what that said: the loader behind the model cache
    does not resolve it again."""
    from attnviz.server import specs
    from ui import models

    seen = []
    real = specs.resolve

    def counting(spec, cfg=None):
        seen.append(spec)
        return real(spec, cfg)

    env.setattr(specs, "resolve", counting)
    models._cached_model.clear()
    models._ready().clear()
    at = new_app(model="tiny:gpt2", text="a quick brown fox").run()
    ok(at)
    assert seen == ["tiny:gpt2"]


def test_bad_link_values_warn_and_fall_back(env):
    at = new_app(model=TINY, text=TEXT, layer=99, head="x", cmap="<b>", log="maybe").run()
    assert not at.exception
    warnings = " ".join(w.value for w in at.warning)
    assert "Layer 99 is out of range (0–2); showing layer 2" in warnings
    assert "`head`: 'x' is not valid" in warnings and "`cmap`" in warnings and "`log`" in warnings
    titled(at, "layer 2 · head 0 ")  # still serving, with valid values
    assert at.query_params["layer"] == "2" and at.query_params["cmap"] == "Viridis"
    # one past the last is the boundary itself (caught: a clamp that kept hi + 1)
    at = new_app(model=TINY, text=TEXT, layer=3, head=4).run()
    warnings = " ".join(w.value for w in at.warning)
    assert "Layer 3 is out of range (0–2); showing layer 2" in warnings
    assert "Head 4 is out of range (0–3); showing head 3" in warnings
    titled(at, "layer 2 · head 3 ")


def test_html_in_the_text_is_shown_literally(env):
    at = new_app(model=TINY, text="<b>x</b>").run()
    ok(at)
    trace = heatmaps(titled(at, "layer 0 · head 0 "))[0]
    assert trace["x"] == labels("<b>x</b>")
    assert any("&lt;" in s for s in trace["x"]) and not any("<" in s for s in trace["x"])
    assert "<" in "".join(at.dataframe[0].value["token"])  # the token table shows it as typed


def test_bad_model_shows_an_error_and_the_app_keeps_serving(env):
    at = new_app(model="a b!! c", text=TEXT).run()
    assert not at.exception
    assert "not a built-in model, a Hub id" in at.error[0].value
    assert at.text_area(key="text").value == TEXT  # the page still renders its controls
    at.text_input(key="model_custom").set_value(TINY).run()
    ok(at)
    titled(at, "layer 0 · head 0 ")


def test_too_long_text_says_what_to_do(env):
    env.setenv("ATTNVIZ_MAX_TOKENS", "8")
    at = new_app(model=TINY, text="the bank of the river " * 5).run()
    assert not at.exception
    assert "Shorten the text" in at.error[0].value


def test_hide_special_tokens_drops_them_and_renormalises(env):
    at = new_app(model=TINY, text=TEXT, hide=1).run()
    ok(at)
    trace = heatmaps(titled(at, "layer 0 · head 0 "))[0]
    assert trace["x"] == labels(TEXT)[1:]  # "(0) <s>" hidden, positions kept
    assert np.allclose(z_of(trace).sum(-1), 1.0, atol=1e-5)


def test_without_the_sink_drops_key_zero_and_renormalises(env):
    at = new_app(model=TINY, text=TEXT, nosink=1).run()
    ok(at)
    trace = heatmaps(titled(at, "layer 0 · head 0 "))[0]
    assert trace["x"] == labels(TEXT)[1:] and trace["y"] == labels(TEXT)
    sums = z_of(trace).sum(-1)
    assert sums[0] == 0 and np.allclose(sums[1:], 1.0, atol=1e-5)  # causal row 0 had only the sink


def test_chat_template_tokens_are_marked_and_can_be_hidden(env):
    at = new_app(model=TINY, text=TEXT, chat=1).run()
    ok(at)
    table = at.dataframe[0].value
    assert table["chat template"].any() and "<|im_start|>" in list(table["token"])
    at.toggle(key="hide").set_value(True).run()
    trace = heatmaps(titled(at, "layer 0 · head 0 "))[0]
    assert not any("im_start" in s for s in trace["x"])


def test_encoder_decoder_offers_encoder_decoder_and_cross(env):
    at = new_app(model="tiny:bart", text=TEXT).run()
    ok(at)
    assert at.segmented_control(key="stack").options == ["encoder", "decoder", "cross (decoder → encoder)"]
    at.segmented_control(key="stack").set_value("cross").run()
    ok(at)
    trace = heatmaps(titled(at, "cross"))[0]
    import tiny

    res = attnviz.extract(tiny.loaded("bart"), TEXT)
    assert trace["x"] == [html.escape(s, quote=False) for s in res.tokens.labels]  # keys: encoder
    assert trace["y"] == [html.escape(s, quote=False) for s in res.decoder_tokens.labels]  # queries
    assert at.query_params["stack"] == "cross"


def test_long_text_pools_the_grid_and_windows_the_head_under_5_mb(env):
    text = " ".join(["the bank of the river", "a quick brown fox jumps over the lazy dog"] * 45)
    # without the sink, rows are renormalised: the exact row path (a query-row window); the
    # plain view is pooled on the device (tests/app/test_app_longview.py)
    at = new_app(model=TINY, text=text, nosink=1).run()
    ok(at)
    n = len(labels(text))
    assert n > 700
    assert at.slider(key="row0").max > 0  # a query-row window
    total = payload_bytes(at)
    assert total < F.PAYLOAD_LIMIT, total
    grid = specs(at)[0]
    assert len(heatmaps(grid)[0]["x"]) <= F.GRID_MAX_SIDE
    at.slider(key="row0").set_value(100).run()
    ok(at)
    trace = heatmaps(titled(at, "layer 0 · head 0 "))[0]
    assert trace["y"][0] == labels(text)[100]


def test_downloads_and_png_name(env):
    at = new_app(model=TINY, text=TEXT, layer=1, head=2).run()
    ok(at)
    labels = [b.label for b in at.get("download_button")]
    grid = ["⬇ HTML: this layer's grid", "⬇ HTML (small, CDN)", "⬇ SVG", "⬇ PDF"]
    assert labels == [*grid, "⬇ NPZ", "⬇ CSV", "⬇ HTML", "⬇ SVG", "⬇ PDF"]  # vector: issue 40
    # the big head's own "⬇ PNG" (in the browser, `ui.heatmaps`) saves under this name
    assert [e["name"] for e in elements(at)] == ["attnviz_tiny-llama-gqa_L1", "attnviz_tiny-llama-gqa_L1_H2"]


def test_a_download_past_the_limit_is_disabled_with_what_to_use(env):
    from attnviz import limits

    n = len(labels(TEXT))
    # the head's NPZ is n × n float32: a limit just below it refuses, one at it allows
    env.setattr(limits, "DOWNLOAD_LIMIT", n * n * 4 - 1)
    at = new_app(model=TINY, text=TEXT, layer=1, head=2).run()
    ok(at)
    npz = next(b for b in at.get("download_button") if b.label == "⬇ NPZ")
    assert npz.proto.disabled
    said = [c.value for c in at.caption if f"NPZ of {n:,} × {n:,} weights" in c.value]
    assert said and "attnviz.extract(" in said[0]
    env.setattr(limits, "DOWNLOAD_LIMIT", n * n * 4)
    at = new_app(model=TINY, text=TEXT, layer=1, head=2).run()
    npz = next(b for b in at.get("download_button") if b.label == "⬇ NPZ")
    assert not npz.proto.disabled and not any("weights would be" in c.value for c in at.caption)


def test_download_refusal_sizes():
    from attnviz import limits

    assert limits.download_refusal(5792, 5792, "npz") is None  # 128 MiB of float32
    msg = limits.download_refusal(8192, 8192, "npz")
    assert msg is not None and "8,192 × 8,192" in msg and "256 MiB" in msg and "128 MiB" in msg
    assert limits.download_refusal(4000, 4000, "csv") is not None  # 11 bytes a cell


def test_export_helpers_round_trip():
    from ui import export

    probs = np.array([[1.0, 0.0], [0.25, 0.75]], dtype=np.float32)
    data = np.load(io.BytesIO(export.npz_bytes(attention=probs, tokens=np.array(["(0) a", "(1) <b>"]))))
    np.testing.assert_array_equal(data["attention"], probs)
    csv = export.csv_text(probs, ["(0) a", "(1) <b>"], ["(0) a", "(1) <b>"], "query \\ key")
    assert csv.splitlines()[0] == "query \\ key,(0) a,(1) <b>" and csv.splitlines()[2] == "(1) <b>,0.25,0.75"
    fig = F.head_heatmap(probs, ["(0) a", "(1) b"])
    page = export.html_bytes(fig, offline=True)
    small = export.html_bytes(fig)  # the download button's file: plotly.js from its CDN
    assert b"cdn.plot.ly" in small and len(small) < 20_000
    assert b"<html>" in page and b"plotly" in page.lower() and len(page) > 1_000_000  # plotly.js inside


def test_the_token_stays_out_of_the_url_and_the_cache_key(env):
    secret = "hf_attnviz_test_secret_123"
    at = new_app(model=TINY, text=TEXT).run()
    at.text_input(key="hf_token").set_value(secret).run()
    ok(at)
    assert secret not in json.dumps(dict(at.query_params)) and secret not in share_link(at)
    import tiny

    from ui import models

    key = models.result_key(tiny.loaded("llama-gqa"), secret, TEXT, chat=False)
    assert secret not in repr(key) and models.token_key(secret) in key  # a keyed digest only


def test_markdown_in_links_and_model_names_is_shown_literally(env):
    """A user value that looks like Markdown shows as inline code: exactly as typed, never a link
    (GFM autolinks a bare http:// even when it is backslash-escaped)."""
    phish = "[log in](http://127.0.0.1:9/phish)"
    at = new_app(model=TINY, text=TEXT, layer=phish).run()
    warning = at.warning[0].value
    assert f"`layer`: `{phish}` is not valid" in warning and "showing '0' instead" in warning
    at = new_app(model=phish, text=TEXT).run()
    error = at.error[0].value
    assert error.startswith(f"`{phish}` is not a built-in model")
    assert not at.status  # refused by name, before any loading box


def test_md_escapes_markdown_and_breaks_autolinks():
    from ui.text import JOINER, code, literal, md, md_in

    assert md("-1") == "-1" and md("a.b") == "a.b" and md("the bank") == "the bank"
    assert md("**x** [a](b) $y$ <i> :red[z]") == "\\*\\*x\\*\\* \\[a\\]\\(b\\) \\$y\\$ \\<i\\> \\:red\\[z\\]"
    assert md("http://x.io www.x.io a@b.io").replace(JOINER, "") == "http\\://x.io www.x.io a@b.io"
    assert "://" not in md("http://x") and "www." not in md("www.x") and "@b" not in md("a@b.io")
    # code spans: a fence longer than any backtick run inside; padded where a backtick is at an end
    assert code("a`b") == "``a`b``" and code("`x") == "`` `x ``" and code("two\nlines") == "`two lines`"
    assert literal("gpt2") == "gpt2" and literal("gpt2", quote=True) == "'gpt2'"
    assert literal("a*b", quote=True) == "`a*b`" and literal("http://x") == "`http://x`"
    # quoted values (as {spec!r} writes them) become code; short plain values elsewhere stay as they are
    assert md_in("model 'a*b' not found (try gpt2)", "a*b") == "model `a*b` not found (try gpt2)"
    assert md_in("'the' is not the model", "the") == "'the' is not the model"
    assert md_in("x a*b y", "a*b") == "x a\\*b y"


def test_explorer_shows_the_self_check_next_to_the_heatmaps(env):
    """The app runs the self-check by default on short texts and says what it measured."""
    import re

    at = new_app(model=TINY, text="the bank of the river").run()
    assert not at.exception
    text = " ".join(c.value for c in at.caption)
    m = re.search(r"checked against eager: max \|Δ\| (\S+), float32 \(self layer 1\)", text)
    assert m, text[:600]
    assert float(m.group(1)) <= 1e-5
    assert "fast exact" in text
