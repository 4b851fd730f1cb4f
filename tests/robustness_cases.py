"""The bad-input cases: one case a row, each run where it bites (tests/engine/test_robustness.py,
tests/app/test_robustness_app.py, tests/browser/), the service answering afterwards. The table in
docs/robustness.md is generated from CASES and the app's expectations (`python
tests/robustness_cases.py` prints it) and a test checks the doc still matches."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
import transformers as tf
from streamlit.testing.v1 import AppTest

import attnviz

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "robustness.md"
SECRET = "hf_rObUsTnEsStOkEn0123456789"
OK = "ok"  # expected outcome of cases that must work (and show the text literally)
# The app cases' model and valid text, and a markdown link that must stay literal text.
TINY = "tiny:llama-gqa"
VALID = "the bank of the river"
PHISH = "[log in](http://127.0.0.1:9/phish)"


@dataclass(frozen=True)
class Case:
    id: str
    tried: str  # what the user does, for the doc
    expect: str  # the attnviz error class name, or OK
    message: str  # regex the message must match (for OK: what is checked instead)
    levels: tuple[str, ...]  # where it is tested: engine, app, browser
    xfail: str = ""  # engine fix still needed (strict xfail until it lands)


E, A, B = "engine", "app", "browser"
CASES: tuple[Case, ...] = (
    # -- text ---------------------------------------------------------------------------------
    Case("text-empty", "empty text", "EmptyInput", r"text is empty; type a sentence", (E, A)),
    Case("text-whitespace", "only spaces, tabs, newlines, U+3000", "EmptyInput", r"type a sentence", (E, A)),
    Case(
        "text-100k-chars",
        "100,000 characters (demo cap 512 tokens)",
        "InputTooLong",
        r"limit is 512\. Shorten",
        (E, A),
    ),
    Case(
        "text-over-cap",
        "one token over the cap",
        "InputTooLong",
        r"the limit is \d+\. Shorten the text",
        (E,),
    ),
    Case("text-at-cap", "exactly the cap", OK, "N == cap is accepted", (E,)),
    Case("text-control-nul", "NUL, BEL, ESC[31m, DEL", OK, "shown as control pictures ␀ ␇ ␛ ␡", (E, A)),
    Case("text-emoji", "emoji with ZWJ and skin tone", OK, "decodes back to the text", (E, A)),
    Case("text-rtl", "Hebrew and Arabic", OK, "decodes back to the text", (E, A)),
    Case("text-combining", "combining accents, zalgo", OK, "decodes back to the text", (E, A)),
    Case("text-bidi-zero-width", "U+202E, U+200B, U+FEFF", OK, "decodes back to the text", (E,)),
    Case(
        "text-lone-surrogate",
        "a lone UTF-16 surrogate (\\ud800)",
        "AttnvizError",
        r"(?i)unicode|surrogate",
        (E,),
    ),
    Case("html-bold", "`<b>x</b>`", OK, "literal `<b>`, no element", (E, A, B)),
    Case("html-script", "`<script>alert(1)</script>`", OK, "literal, never executed", (E, A, B)),
    Case("html-img-onerror", "`<img src=x onerror=alert(1)>`", OK, "literal, never executed", (E, A, B)),
    Case("markdown", "`**bold** _it_ [a](http://x) # h`", OK, "literal asterisks, no link", (E, A, B)),
    Case("latex", "`$x^2$ \\(y\\) $$z$$`", OK, "literal dollars, no maths", (E, A, B)),
    Case("html-entity", "`&lt;b&gt; &amp;`", OK, "literal `&lt;`, not `<`", (E, B)),
    # -- model ids in demo mode -------------------------------------------------------------
    Case("demo-traversal", "model `../..`", "NotAllowed", r"public demo only serves", (E, A)),
    Case("demo-abs-path", "model `/etc`", "NotAllowed", r"public demo only serves", (E, A)),
    Case("demo-home", "model `~`", "NotAllowed", r"public demo only serves", (E, A)),
    Case("demo-file-url", "model `file:///etc/passwd`", "NotAllowed", r"public demo only serves", (E, A)),
    Case(
        "demo-local-name",
        "a bare name that is a local folder",
        "NotAllowed",
        r"public demo only serves",
        (E,),
    ),
    Case("demo-hub-id", "a Hub id outside the allow-list", "NotAllowed", r"public demo only serves", (E, A)),
    Case(
        "local-refused",
        "path-like ids with allow_local=False",
        "NotAllowed",
        r"local paths are not allowed",
        (E,),
    ),
    # -- model ids, full mode ---------------------------------------------------------------
    Case("model-empty", "no model", "ModelNotFound", r"no model given", (E,)),
    Case(
        "model-malformed",
        "`a b!! c`, a URL, `org/../x`",
        "ModelNotFound",
        r"not a built-in model, a Hub id",
        (E, A),
    ),
    Case(
        "model-id-300-chars",
        "a 300-character model id",
        "ModelNotFound",
        r"is 300 characters long; a Hub id is at most",
        (E, A),
    ),
    Case(
        "model-file-url", "`file:///etc` (full mode)", "NotAllowed", r"file:// URLs are not supported", (E,)
    ),
    Case(
        "model-not-a-model-folder",
        "`/etc` (full mode)",
        "ModelNotFound",
        r"is not a model folder|does not exist",
        (E,),
    ),
    Case(
        "hub-missing",
        "a Hub id that does not exist",
        "ModelNotFound",
        r"not found on the Hugging Face Hub",
        (E, A),
    ),
    Case(
        "hub-offline", "not cached, HF_HUB_OFFLINE=1", "ModelNeedsNetwork", r"Hub cannot be reached", (E, A)
    ),
    Case(
        "hub-no-network",
        "not cached, Hub unreachable (closed loopback port)",
        "ModelNeedsNetwork",
        r"Hub cannot be reached",
        (E,),
    ),
    Case("hub-gated", "gated id, no token", "GatedModel", r"is gated: accept its licence", (E, A)),
    Case(
        "hub-gated-token-echo", "gated id, the server echoes the bad token", "GatedModel", r"is gated", (E,)
    ),
    Case("no-attention", "an xLSTM model folder", "ModelHasNoAttention", r"no softmax attention", (E, A)),
    Case(
        "pickle-refused",
        "a folder with only pytorch_model.bin",
        "UnsafeWeights",
        r"ATTNVIZ_ALLOW_PICKLE=1",
        (E, A),
    ),
    Case("pickle-allowed", "the same with ATTNVIZ_ALLOW_PICKLE=1", OK, "loads", (E,)),
    Case(
        "remote-code",
        "config with auto_map to custom code",
        "NotAllowed",
        r"ATTNVIZ_TRUST_REMOTE_CODE",
        (E, A),
    ),
    Case(
        "remote-code-known-type",
        "auto_map on a llama config",
        OK,
        "built-in class, custom code never run",
        (E,),
    ),
    # -- indices and options ----------------------------------------------------------------
    Case(
        "index-layer-high",
        "layer 99",
        "BadIndex",
        r"layer 99 is out of range: this model has layers 0\.\.",
        (E, A),
    ),
    Case("index-head-high", "head 99", "BadIndex", r"head 99 is out of range", (E, A)),
    Case("index-negative", "layer -1", "BadIndex", r"out of range", (E, A)),
    Case(
        "index-stack",
        "stack `cross` on a decoder-only model",
        "BadIndex",
        r"stack 'cross' not in this model",
        (E,),
    ),
    Case("option-generate-negative", "generate -1", "AttnvizError", r"0 or more", (E,)),
    Case("option-path", "path `turbo`", "AttnvizError", r"unknown path", (E,)),
    Case(
        "option-chat-no-template",
        "chat on a model without a chat template",
        "AttnvizError",
        r"turn the chat option off",
        (E,),
    ),
    # -- memory -----------------------------------------------------------------------------
    Case(
        "oom-extract",
        "torch.OutOfMemoryError in the forward pass",
        "OutOfMemory",
        r"did not fit in memory",
        (E, A),
    ),
    Case("oom-load", "torch.OutOfMemoryError while loading", "OutOfMemory", r"does not fit in memory", (E,)),
    Case(
        "oom-rlimit",
        "a real address-space limit (RLIMIT_AS) in a subprocess",
        "OutOfMemory",
        r"did not fit in memory",
        (E,),
    ),
    # -- share links and widgets (app only; the engine never sees these) ---------------------
    Case(
        "link-text-too-long", "`?text=` of 100,001 characters", "warning", r"at most 60000 characters", (A,)
    ),
    Case(
        "link-tz-garbage", "`?tz=` that is not a compressed text", "warning", r"not a compressed text", (A,)
    ),
    Case(
        "link-tz-bomb",
        "`?tz=` inflating to 3 MB (a few kB in the link)",
        "warning",
        r"longer than 60000 characters",
        (A,),
    ),
    Case("link-not-a-number", "`?layer=abc`", "warning", r"use a whole number", (A,)),
    Case("link-bad-bool", "`?chat=maybe`", "warning", r"use 1 or 0", (A,)),
    Case("link-bad-choice", "`?cmap=<script>`", "warning", r"use one of", (A,)),
    Case("link-stack", "`?stack=cross` on a decoder-only model", "warning", r"not available here", (A,)),
    Case("link-unknown-param", "`?utm_source=x&__proto__=1`", OK, "ignored, no message", (A,)),
    Case(
        "link-markdown",
        "`?layer=[log in](http://127.0.0.1:9/phish)`",
        "warning",
        r"is not valid",
        (A, B),
    ),
    Case(
        "model-markdown",
        "`?model=[log in](http://127.0.0.1:9/phish)`",
        "ModelNotFound",
        r"not a built-in",
        (A, B),
    ),
)
BY_ID = {c.id: c for c in CASES}


@dataclass
class Ctx:
    lm: attnviz.LoadedModel
    folders: dict[str, Path]
    monkeypatch: pytest.MonkeyPatch


def hub_raises(ctx: Ctx, exc: Exception) -> None:
    def raise_(*args, **kwargs):
        raise exc

    ctx.monkeypatch.setattr(tf.AutoConfig, "from_pretrained", raise_)


def http_response(status: int) -> httpx2.Response:
    return httpx2.Response(
        status, request=httpx2.Request("GET", "https://huggingface.co/x/resolve/main/config.json")
    )


@dataclass(frozen=True)
class AppCase:
    params: dict[str, str] | Callable[[dict[str, Path]], dict[str, str]]  # the share link
    shows: str  # "error" | "warning" | "info" | OK
    message: str  # regex on the element's text (OK: unused)
    demo: bool = False
    act: Callable[[AppTest], None] | None = None  # widget input after the first run
    patch: Callable[[Ctx], None] | None = None  # monkeypatches before the first run


# -- the doc table ------------------------------------------------------------------------------
def table(app: Mapping[str, AppCase]) -> str:
    """The cases table of docs/robustness.md: engine expectation, what the app shows, where tested."""
    rows = [
        "| id | tried | engine (or first level) expects | app shows | tested in |",
        "|---|---|---|---|---|",
    ]

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    for c in CASES:
        expect = c.expect if c.expect == OK else f"{c.expect} `{cell(c.message)}`"
        if c.expect == OK:
            expect += f" ({cell(c.message)})"
        if c.xfail:
            expect += " **(fix pending)**"
        shows = app.get(c.id)
        shown = ""
        if shows is not None:
            shown = shows.shows if shows.shows == OK else f"{shows.shows} `{cell(shows.message)}`"
        rows.append(f"| {c.id} | {c.tried} | {expect} | {shown} | {', '.join(c.levels)} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent / "app"))
    from test_robustness_app import APP

    print(table(APP))
