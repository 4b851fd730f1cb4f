"""Bad input through the app (streamlit.testing AppTest, in process, tiny models), one case a row
(tests/robustness_cases.py): the expected message, no exception, no token anywhere, and the same
session answering the next valid request; a token typed in one session never reaches another."""

from __future__ import annotations

import html
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
from robustness_cases import (
    CASES,
    DOC,
    OK,
    PHISH,
    SECRET,
    TINY,
    VALID,
    A,
    AppCase,
    Case,
    Ctx,
    http_response,
    hub_raises,
    table,
)
from streamlit.testing.v1 import AppTest

import attnviz
from ui.params import pack_text

ROOT = Path(__file__).resolve().parents[2]


def test_doc_table_lists_every_case():
    doc = DOC.read_text()
    assert table(APP) in doc, "docs/robustness.md is out of date: paste `python tests/robustness_cases.py`"


def _type_text(text: str) -> Callable[[AppTest], None]:
    return lambda at: at.text_area(key="text").set_value(text).run()


def _type_token(at: AppTest) -> None:
    at.text_input(key="hf_token").set_value(SECRET).run()


def _gated_patch(ctx: Ctx) -> None:
    hub_raises(ctx, GatedRepoError(f"401 Client Error: bad token {SECRET}", response=http_response(401)))


def _oom_patch(ctx: Ctx) -> None:
    import tiny

    from ui import models

    models._cached_model.clear()  # the app must load tiny.model("llama-gqa"), the patched one
    model = tiny.model("llama-gqa")
    real = model.forward

    def forward(*args, **kwargs):  # the load's short check passes; the page's longer text runs out
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[-1] <= 8:
            return real(*args, **kwargs)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    ctx.monkeypatch.setattr(model, "forward", forward)


def _missing_patch(ctx: Ctx) -> None:
    hub_raises(ctx, RepositoryNotFoundError("404 Client Error", response=http_response(404)))


APP: dict[str, AppCase] = {
    "text-empty": AppCase({"text": ""}, "info", r"Type a text"),
    "text-whitespace": AppCase({"text": " \t\n\u3000 "}, "info", r"Type a text"),
    "text-100k-chars": AppCase(
        {}, "error", r"100,000 characters; the limit is 60,000", demo=True, act=_type_text("bank " * 20_000)
    ),
    "text-control-nul": AppCase({"text": "a\x00b\x07c\x1b[31mred\x7f"}, OK, ""),
    "text-emoji": AppCase({"text": "family 👨‍👩‍👧 thumbs 👍🏽 🙂"}, OK, ""),
    "text-rtl": AppCase({"text": "שלום עולם and مرحبا بالعالم"}, OK, ""),
    "text-combining": AppCase({"text": "e\u0301 a\u0308 Z\u0324\u0354\u0367"}, OK, ""),
    "html-bold": AppCase({"text": "<b>x</b>"}, OK, ""),
    "html-script": AppCase({"text": "<script>alert(1)</script>"}, OK, ""),
    "html-img-onerror": AppCase({"text": "<img src=x onerror=alert(1)>"}, OK, ""),
    "markdown": AppCase({"text": "**bold** _it_ [a](http://x) # h"}, OK, ""),
    "latex": AppCase({"text": "$x^2$ \\(y\\) $$z$$"}, OK, ""),
    "demo-traversal": AppCase({"model": "../.."}, "warning", r"not offered on this server", demo=True),
    "demo-abs-path": AppCase({"model": "/etc"}, "warning", r"not offered on this server", demo=True),
    "demo-home": AppCase({"model": "~"}, "warning", r"not offered on this server", demo=True),
    "demo-file-url": AppCase(
        {"model": "file:///etc/passwd"}, "warning", r"not offered on this server", demo=True
    ),
    "demo-hub-id": AppCase({"model": "gpt2"}, "warning", r"not offered on this server", demo=True),
    "model-malformed": AppCase({"model": "a b!! c"}, "error", r"not a built-in model, a Hub id"),
    "model-id-300-chars": AppCase(  # refused while the link is read, by the engine's one name rule
        {"model": "a" * 300}, "warning", r"is 300 characters long; a Hub id is at most"
    ),
    "hub-missing": AppCase(
        {"model": "attnviz-test/gone"}, "error", r"not found on the Hugging Face Hub", patch=_missing_patch
    ),
    "hub-offline": AppCase({"model": "attnviz-test/not-cached"}, "error", r"Hub cannot be reached"),
    "hub-gated": AppCase(
        {"model": "meta-llama/Llama-3.2-1B"},
        "error",
        r"is gated: accept its licence",
        act=_type_token,
        patch=_gated_patch,
    ),
    "no-attention": AppCase(lambda f: {"model": str(f["mamba"])}, "error", r"no softmax attention"),
    "pickle-refused": AppCase(lambda f: {"model": str(f["pickle"])}, "error", r"ATTNVIZ_ALLOW_PICKLE=1"),
    "remote-code": AppCase(lambda f: {"model": str(f["remote"])}, "error", r"ATTNVIZ_TRUST_REMOTE_CODE"),
    "index-layer-high": AppCase(
        {"layer": "99"}, "warning", r"Layer 99 is out of range \(0–2\); showing layer 2"
    ),
    "index-head-high": AppCase({"head": "99"}, "warning", r"Head 99 is out of range \(0–3\); showing head 3"),
    "index-negative": AppCase({"layer": "-1"}, "warning", r"`layer`: '-1' is not valid"),
    "oom-extract": AppCase(
        {"text": "out of memory here, on a text longer than the load's check"},
        "error",
        r"did not fit in memory",
        patch=_oom_patch,
    ),
    "link-text-too-long": AppCase({"text": "a" * 100_001}, "warning", r"at most 60000 characters"),
    "link-tz-garbage": AppCase({"tz": "%%%not-base64"}, "warning", r"not a compressed text"),
    "link-tz-bomb": AppCase({"tz": pack_text("a" * 3_000_000)}, "warning", r"longer than 60000 characters"),
    "link-not-a-number": AppCase({"layer": "abc"}, "warning", r"use a whole number"),
    "link-bad-bool": AppCase({"chat": "maybe"}, "warning", r"use 1 or 0"),
    "link-bad-choice": AppCase({"cmap": "<script>"}, "warning", r"use one of"),
    "link-stack": AppCase({"stack": "cross"}, "warning", r"not available here"),
    "link-unknown-param": AppCase({"utm_source": "x", "__proto__": "1"}, OK, ""),
    "link-markdown": AppCase({"layer": PHISH}, "warning", r"is not valid"),
    "model-markdown": AppCase({"model": PHISH}, "error", r"not a built-in model"),
}


def new_app(monkeypatch: pytest.MonkeyPatch, params: dict[str, str], *, demo: bool = False) -> AppTest:
    """A fresh session of app.py on the tiny test models (the link's params set)."""
    if demo:
        monkeypatch.setenv("ATTNVIZ_DEMO", "1")
        monkeypatch.setenv("ATTNVIZ_ALLOWED_MODELS", TINY)
    else:
        monkeypatch.delenv("ATTNVIZ_DEMO", raising=False)
        monkeypatch.delenv("ATTNVIZ_ALLOWED_MODELS", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    for name, value in {"model": TINY, "text": VALID, **params}.items():
        at.query_params[name] = value
    return at


def texts(at: AppTest, kind: str) -> list[str]:
    return [str(e.value) for e in getattr(at, kind)]


def chart_specs(at: AppTest) -> list[dict]:
    from apptest import specs

    return specs(at)


def assert_renders(at: AppTest, text: str) -> None:
    """No exception, no error, charts drawn, and the token table shows the engine's tokens."""
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, texts(at, "error")
    specs = chart_specs(at)
    assert specs, "no chart"
    import tiny

    display = list(attnviz.extract(tiny.loaded("llama-gqa"), text).tokens.display)
    assert list(at.dataframe[0].value["token"]) == display
    labels = [f"({i}) {d}" for i, d in enumerate(display)]
    head = [
        s
        for s in specs
        if re.search(r"layer \d+ · head \d+", (s["layout"].get("title") or {}).get("text", ""))
    ]
    assert head, "no single-head view"
    escaped = [html.escape(s, quote=False) for s in labels]
    heats = [
        t
        for s in specs
        for t in s["data"]
        if t.get("type") == "heatmap" and len(t.get("x", [])) == len(labels)
    ]
    assert heats, "no token heatmap"
    assert all(list(h["x"]) == escaped for h in heats), "labels not escaped for Plotly"
    drawn = [s["element"] for s in specs if "element" in s]  # `ui.heatmaps`: text set as text
    assert all(p["k"] == labels for e in drawn for p in e["panels"] if len(p["k"]) == len(labels))


def recover(at: AppTest) -> None:
    """The next valid request in the same session: tiny model, a plain text."""
    if _has(at, "text_input", "model_custom"):
        at.text_input(key="model_custom").set_value(TINY)
    elif at.selectbox(key="model_choice").value != TINY:
        options = at.selectbox(key="model_choice").options
        at.selectbox(key="model_choice").set_value(TINY if TINY in options else options[-1]).run()
        if _has(at, "text_input", "model_custom"):
            at.text_input(key="model_custom").set_value(TINY)
    at.text_area(key="text").set_value(VALID).run()
    assert_renders(at, VALID)


def _has(at: AppTest, kind: str, key: str) -> bool:
    return any(getattr(e, "key", None) == key for e in getattr(at, kind))


def _app_params():
    for c in CASES:
        if A in c.levels:
            marks = [pytest.mark.xfail(strict=True, reason=c.xfail)] if c.xfail else []
            yield pytest.param(c, marks=marks, id=c.id)


def test_every_app_case_has_a_check():
    assert {c.id for c in CASES if A in c.levels} == set(APP)


@pytest.mark.parametrize("case", list(_app_params()))
def test_app(case: Case, lm, folders, monkeypatch, caplog):
    """One session opens the bad link (or types the bad input): the expected message, no
    exception, no token anywhere; then the same session asks something valid and gets it."""
    spec = APP[case.id]
    caplog.set_level(logging.INFO)
    params = spec.params(folders) if callable(spec.params) else spec.params
    with pytest.MonkeyPatch.context() as patches:  # undone before the valid request
        if spec.patch:
            spec.patch(Ctx(lm, folders, patches))
        at = new_app(monkeypatch, params, demo=spec.demo).run()
        if spec.act:
            spec.act(at)
    assert not at.exception, [e.value for e in at.exception]
    if spec.shows == OK:
        assert not at.error and not at.warning, texts(at, "error") + texts(at, "warning")
        assert_renders(at, at.text_area(key="text").value)
    else:
        shown = texts(at, spec.shows)
        assert any(re.search(spec.message, t) for t in shown), (
            f"{spec.shows}: {shown}; errors: {texts(at, 'error')}"
        )
    everything = " ".join(texts(at, "error") + texts(at, "warning") + texts(at, "markdown")) + caplog.text
    assert SECRET not in everything and SECRET not in json.dumps(dict(at.query_params))
    assert "Traceback" not in everything
    recover(at)


# -- safe defaults: tokens ---------------------------------------------------------------------
def test_a_token_typed_in_one_session_is_never_used_by_another(monkeypatch, tmp_path):
    """Session A types a token and loads a gated model; session B asks for the same model without a
    token and must get the gated error (its own load with no token), not A's cached model. The
    token is in no URL, message, log line or file."""
    import tiny

    from attnviz.server import specs
    from ui import models

    calls: list[tuple[str, str | None]] = []

    def fake_load(spec, source, *, token=None, **kwargs):
        calls.append((spec, token))
        if token != SECRET:
            raise attnviz.GatedModel(
                f"{spec!r} is gated: accept its licence on huggingface.co and give a token"
            )
        return tiny.loaded("llama-gqa")

    monkeypatch.setattr(specs, "load_source", fake_load)  # where the app loads through
    gated = "attnviz-test/gated-model"
    a = new_app(monkeypatch, {"model": gated}).run()
    assert any("is gated" in t for t in texts(a, "error"))
    a.text_input(key="hf_token").set_value(SECRET).run()
    assert not a.exception and not a.error, texts(a, "error")
    assert chart_specs(a)
    b = new_app(monkeypatch, {"model": gated}).run()
    assert any("is gated" in t for t in texts(b, "error")), "session B got session A's gated model"
    assert calls == [(gated, None), (gated, SECRET), (gated, None)], calls
    for at in (a, b):
        assert SECRET not in json.dumps(dict(at.query_params))
        shown = texts(at, "error") + texts(at, "warning") + texts(at, "markdown") + texts(at, "caption")
        assert not any(SECRET in t for t in shown)
        assert not any(SECRET in str(k) for k in models.results_cache()._items)
    for folder in (Path.home() / ".streamlit", attnviz.loading.cache_dir(), ROOT / "test-output"):
        for f in folder.rglob("*") if folder.exists() else ():
            if f.is_file() and f.stat().st_size < 50 * 2**20:
                assert SECRET.encode() not in f.read_bytes(), f"the token was written to {f}"
