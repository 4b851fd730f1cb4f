"""Bad input, one case a row: each case runs where it bites (engine, app, browser) and the service
keeps answering afterwards. The table in docs/robustness.md is generated from CASES
(`python tests/test_robustness.py` prints it) and a test checks the doc still matches.
"""

from __future__ import annotations

import gc
import html
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import urllib.parse
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx2
import numpy as np
import pytest
import torch
import transformers as tf
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz.server.settings import settings
from attnviz.server.specs import resolve
from ui.params import pack_text

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "robustness.md"
SECRET = "hf_rObUsTnEsStOkEn0123456789"
OK = "ok"  # expected outcome of cases that must work (and show the text literally)


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
    Case("no-attention", "a Mamba model folder", "ModelHasNoAttention", r"no softmax attention", (E, A)),
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


# -- the doc table ------------------------------------------------------------------------------
def table() -> str:
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
        app = APP.get(c.id)
        shown = (
            "" if app is None else (app.shows if app.shows == OK else f"{app.shows} `{cell(app.message)}`")
        )
        rows.append(f"| {c.id} | {c.tried} | {expect} | {shown} | {', '.join(c.levels)} |")
    return "\n".join(rows)


def test_cases_are_enough_and_unique():
    assert len(CASES) >= 30
    assert len(BY_ID) == len(CASES)


def test_doc_table_lists_every_case():
    doc = DOC.read_text()
    assert table() in doc, "docs/robustness.md is out of date: paste `python tests/test_robustness.py`"


# -- engine level -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Tiny model folders on disk: safetensors, pickle-only, Mamba, custom code."""
    import tiny

    root = tmp_path_factory.mktemp("models")
    cfg = tiny.configs()["llama-gqa"]
    model = tf.LlamaForCausalLM(cfg)
    pickle_dir = root / "pickle"
    model.config.save_pretrained(pickle_dir)
    torch.save(model.state_dict(), pickle_dir / "pytorch_model.bin")
    tiny.tokenizer().save_pretrained(pickle_dir)
    mamba = tf.MambaForCausalLM(
        tf.MambaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, state_size=4)
    )
    mamba.save_pretrained(root / "mamba")
    for name, model_type in (("remote", "attnviz_custom"), ("remote-llama", "llama")):
        d = root / name
        if model_type == "llama":
            model.save_pretrained(d)
            tiny.tokenizer().save_pretrained(d)
        config = json.loads((d / "config.json").read_text()) if (d / "config.json").exists() else {}
        config |= {
            "model_type": model_type,
            "auto_map": {"AutoConfig": "custom.Config", "AutoModelForCausalLM": "custom.Model"},
        }
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(json.dumps(config))
        (d / "custom.py").write_text(f"import pathlib\npathlib.Path({str(d / 'RAN')!r}).write_text('ran')\n")
    return {"root": root, "pickle": pickle_dir, "mamba": root / "mamba", "remote": root / "remote",
            "remote-llama": root / "remote-llama"}  # fmt: skip


@pytest.fixture(scope="module")
def lm():
    import tiny

    return tiny.loaded("llama-gqa")


@dataclass
class Ctx:
    lm: attnviz.LoadedModel
    folders: dict[str, Path]
    monkeypatch: pytest.MonkeyPatch


def assert_still_answers(lm: attnviz.LoadedModel) -> None:
    res = attnviz.extract(lm, "the financial bank is located on river bank")
    probs = res.head(lm.layout.n_layers - 1, 0)
    assert np.allclose(probs.sum(-1), 1, atol=1e-5)


def literal(ctx: Ctx, text: str, *, shown: str | None = None) -> None:
    """The text goes through untouched: the ids decode back to it, display tokens are plain text."""
    res = attnviz.extract(ctx.lm, text)
    tok = ctx.lm.tokenizer
    assert tok.decode(list(res.tokens.ids), skip_special_tokens=True) == text
    joined = "".join(res.tokens.display)
    assert joined.count("&") == text.count("&") and joined.count("<") >= text.count("<")  # not escaped
    assert all(ord(ch) >= 32 for ch in joined)
    if shown is not None:
        assert shown in joined


def demo(ctx: Ctx, spec: str):
    ctx.monkeypatch.setenv("ATTNVIZ_DEMO", "1")
    ctx.monkeypatch.delenv("ATTNVIZ_ALLOWED_MODELS", raising=False)
    s = settings()
    resolve(spec, s)  # what the app does before loading
    return attnviz.load_model(spec, allow_local=s.allow_local_paths)


def hub_raises(ctx: Ctx, exc: Exception) -> None:
    def raise_(*args, **kwargs):
        raise exc

    ctx.monkeypatch.setattr(tf.AutoConfig, "from_pretrained", raise_)


def http_response(status: int) -> httpx2.Response:
    return httpx2.Response(
        status, request=httpx2.Request("GET", "https://huggingface.co/x/resolve/main/config.json")
    )


def _chdir_local_name(ctx: Ctx):
    ctx.monkeypatch.chdir(ctx.folders["root"])
    assert Path("pickle").is_dir()
    return demo(ctx, "pickle")


def _local_refused(ctx: Ctx):
    for spec in ("../..", "/etc", "~", "file:///etc/passwd", str(ctx.folders["pickle"])):
        with pytest.raises(attnviz.NotAllowed, match="local paths are not allowed"):
            attnviz.load_model(spec, allow_local=False)
    attnviz.load_model("/etc", allow_local=False)


def _malformed(ctx: Ctx):
    for spec in ("https://huggingface.co/gpt2", "org/../x", "a" * 200):
        with pytest.raises(attnviz.ModelNotFound, match="not a built-in model"):
            attnviz.load_model(spec)
    attnviz.load_model("a b!! c")


def _long_id(ctx: Ctx):
    resolve("a" * 300, settings())


def _over_cap(ctx: Ctx):
    n = len(attnviz.tokenize(ctx.lm, "the bank " * 40)[0])
    attnviz.extract(ctx.lm, "the bank " * 40, max_tokens=n - 1)


def _at_cap(ctx: Ctx):
    n = len(attnviz.tokenize(ctx.lm, "the bank " * 40)[0])
    assert attnviz.extract(ctx.lm, "the bank " * 40, max_tokens=n).n_tokens == n


def _control(ctx: Ctx):
    res = attnviz.extract(ctx.lm, "a\x00b\x07c\x1b[31mred\x7f")
    joined = "".join(res.tokens.display)
    for pic in "␀␇␛␡":
        assert pic in joined
    assert not any(ord(ch) < 32 or ord(ch) == 127 for ch in joined)


def _no_network(ctx: Ctx):
    """A fresh process (huggingface_hub reads its settings at import) with the Hub on a closed
    loopback port: refused at once, never a network timeout."""
    code = textwrap.dedent(f"""
        import attnviz
        try:
            attnviz.load_model("attnviz-test/not-cached", token={SECRET!r})
        except attnviz.AttnvizError as err:
            print(type(err).__name__ + ": " + str(err))
    """)
    hf_home = str(ctx.folders["root"] / "hf")
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": hf_home}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    name, _, message = proc.stdout.strip().splitlines()[-1].partition(": ")
    assert SECRET not in proc.stdout + proc.stderr
    raise getattr(attnviz, name)(message)


def _gated_echo(ctx: Ctx):
    hub_raises(
        ctx,
        GatedRepoError(
            f"401 Client Error: invalid token {SECRET} for gated repo", response=http_response(401)
        ),
    )
    attnviz.load_model("meta-llama/Llama-3.2-1B", token=SECRET)


def _pickle_allowed(ctx: Ctx):
    ctx.monkeypatch.setenv("ATTNVIZ_ALLOW_PICKLE", "1")
    assert attnviz.load_model(str(ctx.folders["pickle"])).layout.n_layers == 3


def _remote(ctx: Ctx, name: str):
    try:
        return attnviz.load_model(str(ctx.folders[name]))
    finally:
        assert not (ctx.folders[name] / "RAN").exists(), "custom code from the model folder was executed"


def _chat_no_template(ctx: Ctx):
    import tiny

    attnviz.extract(tiny.loaded("bert"), "hello", chat=True)


def _oom_extract(ctx: Ctx):
    """The forward pass allocates ~64 MB, then runs out of memory; after the error that memory is
    free (no reference kept by the engine) and the next request works."""
    import tiny

    model = tf.LlamaForCausalLM(tiny.configs()["llama-gqa"]).eval()
    lm = attnviz.wrap_model(model, tiny.tokenizer(), spec="tiny-oom")
    held: list[weakref.ref] = []

    def forward(*args, **kwargs):
        big = torch.ones(16 * 2**20)
        held.append(weakref.ref(big))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB")

    ctx.monkeypatch.setattr(model, "forward", forward)
    try:
        attnviz.extract(lm, "the bank")
    except attnviz.OutOfMemory as err:
        message = str(err)
    gc.collect()
    assert held and held[0]() is None, "the failed request's tensors are still referenced"
    ctx.monkeypatch.undo()
    assert_still_answers(lm)
    raise attnviz.OutOfMemory(message)


def _oom_load(ctx: Ctx):
    def raise_(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    ctx.monkeypatch.setattr(tf.AutoModelForCausalLM, "from_pretrained", raise_)
    ctx.monkeypatch.setenv("ATTNVIZ_ALLOW_PICKLE", "1")
    attnviz.load_model(str(ctx.folders["pickle"]))


OOM_RLIMIT = """
import gc, resource, sys
sys.path.insert(0, {tests!r})
import psutil, tiny, attnviz
lm = tiny.loaded("llama-gqa")
attnviz.extract(lm, "warm up", path="eager")
proc = psutil.Process()
before = proc.memory_info().rss
resource.setrlimit(resource.RLIMIT_AS, (proc.memory_info().vms + 300 * 2**20, resource.RLIM_INFINITY))
try:
    attnviz.extract(lm, "bank river " * 1500, path="eager", max_tokens=10**6)  # 4 x 3001^2 floats per layer
    print("NoError: it fitted")
except attnviz.AttnvizError as err:
    print(type(err).__name__ + ": " + str(err))
except Exception as err:
    print("AttnvizError: not translated: " + type(err).__name__ + " " + str(err).splitlines()[0])
gc.collect()
assert attnviz.extract(lm, "the bank", path="eager").n_tokens == 3, "the next request failed"
grown = (proc.memory_info().rss - before) / 2**20
assert grown < 150, f"{{grown:.0f}} MiB still held after the error"
"""


def _oom_rlimit(ctx: Ctx):
    code = OOM_RLIMIT.format(tests=str(ROOT / "tests"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    name, _, message = proc.stdout.strip().splitlines()[-1].partition(": ")
    raise getattr(attnviz, name, AssertionError)(message)


def _res(ctx: Ctx):
    return attnviz.extract(ctx.lm, "the bank")


ENGINE: dict[str, Callable[[Ctx], object]] = {
    "text-empty": lambda c: attnviz.extract(c.lm, ""),
    "text-whitespace": lambda c: attnviz.extract(c.lm, " \t\n\r\u3000  "),
    "text-100k-chars": lambda c: attnviz.extract(c.lm, ("bank " * 20_000)[:100_000], max_tokens=512),
    "text-over-cap": _over_cap,
    "text-at-cap": _at_cap,
    "text-control-nul": _control,
    "text-emoji": lambda c: literal(c, "family 👨‍👩‍👧 thumbs 👍🏽 🙂"),
    "text-rtl": lambda c: literal(c, "שלום עולם and مرحبا بالعالم"),
    "text-combining": lambda c: literal(c, "e\u0301 a\u0308 Z\u0324\u0354\u0367\u0311\u0313"),
    "text-bidi-zero-width": lambda c: literal(c, "\u202eevil\u202c zero\u200bwidth \ufeffbom"),
    "text-lone-surrogate": lambda c: attnviz.extract(c.lm, "\ud800 bank"),
    "html-bold": lambda c: literal(c, "<b>x</b>", shown="<"),
    "html-script": lambda c: literal(c, "<script>alert(1)</script>", shown="script"),
    "html-img-onerror": lambda c: literal(c, "<img src=x onerror=alert(1)>", shown="onerror"),
    "markdown": lambda c: literal(c, "**bold** _it_ [a](http://x) # h", shown="**"),
    "latex": lambda c: literal(c, "$x^2$ \\(y\\) $$z$$", shown="$"),
    "html-entity": lambda c: literal(c, "&lt;b&gt; &amp;", shown="&"),
    "demo-traversal": lambda c: demo(c, "../.."),
    "demo-abs-path": lambda c: demo(c, "/etc"),
    "demo-home": lambda c: demo(c, "~"),
    "demo-file-url": lambda c: demo(c, "file:///etc/passwd"),
    "demo-local-name": _chdir_local_name,
    "demo-hub-id": lambda c: demo(c, "gpt2"),
    "local-refused": _local_refused,
    "model-empty": lambda c: attnviz.load_model("  "),
    "model-malformed": _malformed,
    "model-id-300-chars": _long_id,
    "model-file-url": lambda c: attnviz.load_model("file:///etc"),
    "model-not-a-model-folder": lambda c: attnviz.load_model("/etc"),
    "hub-missing": lambda c: (
        hub_raises(
            c, RepositoryNotFoundError("404 Client Error: Repository Not Found", response=http_response(404))
        ),
        attnviz.load_model("attnviz-test/does-not-exist"),
    ),
    "hub-offline": lambda c: attnviz.load_model("attnviz-test/not-cached"),
    "hub-no-network": _no_network,
    "hub-gated": lambda c: (
        hub_raises(
            c, GatedRepoError("401 Client Error. Cannot access gated repo", response=http_response(401))
        ),
        attnviz.load_model("meta-llama/Llama-3.2-1B"),
    ),
    "hub-gated-token-echo": _gated_echo,
    "no-attention": lambda c: attnviz.load_model(str(c.folders["mamba"])),
    "pickle-refused": lambda c: attnviz.load_model(str(c.folders["pickle"])),
    "pickle-allowed": _pickle_allowed,
    "remote-code": lambda c: _remote(c, "remote"),
    "remote-code-known-type": lambda c: _remote(c, "remote-llama"),
    "index-layer-high": lambda c: _res(c).head(99, 0),
    "index-head-high": lambda c: _res(c).head(0, 99),
    "index-negative": lambda c: _res(c).head(-1, 0),
    "index-stack": lambda c: _res(c).layer(0, stack="cross"),
    "option-generate-negative": lambda c: attnviz.extract(c.lm, "the bank", generate=-1),
    "option-path": lambda c: attnviz.extract(c.lm, "the bank", path="turbo"),  # type: ignore[arg-type]
    "option-chat-no-template": _chat_no_template,
    "oom-extract": _oom_extract,
    "oom-load": _oom_load,
    "oom-rlimit": _oom_rlimit,
}


def _engine_params():
    for c in CASES:
        if E in c.levels:
            marks = [pytest.mark.xfail(strict=True, reason=c.xfail)] if c.xfail else []
            if c.id in ("oom-rlimit", "hub-no-network"):
                marks.append(pytest.mark.slow)
            yield pytest.param(c, marks=marks, id=c.id)


def test_every_engine_case_has_an_action():
    assert {c.id for c in CASES if E in c.levels} == set(ENGINE)


@pytest.mark.parametrize("case", list(_engine_params()))
def test_engine(case: Case, lm, folders, monkeypatch, caplog):
    ctx = Ctx(lm, folders, monkeypatch)
    caplog.set_level(logging.DEBUG)
    if case.expect == OK:
        ENGINE[case.id](ctx)
    else:
        with pytest.raises(attnviz.AttnvizError) as info:
            ENGINE[case.id](ctx)
        err = info.value
        assert type(err).__name__ == case.expect, f"{type(err).__name__}: {err}"
        message = str(err)
        assert re.search(case.message, message), message
        assert "Traceback" not in message and "site-packages" not in message and SECRET not in message
    assert SECRET not in caplog.text
    monkeypatch.undo()
    assert_still_answers(lm)


# -- app level (streamlit.testing AppTest, in process, tiny models) ------------------------------
TINY = "tiny:llama-gqa"
VALID = "the bank of the river"
PHISH = "[log in](http://127.0.0.1:9/phish)"


@dataclass(frozen=True)
class AppCase:
    params: dict[str, str] | Callable[[dict[str, Path]], dict[str, str]]  # the share link
    shows: str  # "error" | "warning" | "info" | OK
    message: str  # regex on the element's text (OK: unused)
    demo: bool = False
    act: Callable[[AppTest], None] | None = None  # widget input after the first run
    patch: Callable[[Ctx], None] | None = None  # monkeypatches before the first run


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

    def forward(*args, **kwargs):  # the load's 6-token check passes; the page's longer text runs out
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[-1] <= 6:
            return real(*args, **kwargs)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    ctx.monkeypatch.setattr(model, "forward", forward)


def _missing_patch(ctx: Ctx) -> None:
    hub_raises(ctx, RepositoryNotFoundError("404 Client Error", response=http_response(404)))


APP: dict[str, AppCase] = {
    "text-empty": AppCase({"text": ""}, "info", r"Type a text"),
    "text-whitespace": AppCase({"text": " \t\n\u3000 "}, "info", r"Type a text"),
    "text-100k-chars": AppCase(
        {}, "error", r"limit is 512\. Shorten", demo=True, act=_type_text("bank " * 20_000)
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
    "index-negative": AppCase({"layer": "-1"}, "warning", r"`layer` value '-1' is not valid"),
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
    return [json.loads(e.proto.spec) for e in at.get("plotly_chart")]


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

    def fake_load(spec, *, token=None, **kwargs):
        calls.append((spec, token))
        if token != SECRET:
            raise attnviz.GatedModel(
                f"{spec!r} is gated: accept its licence on huggingface.co and give a token"
            )
        return tiny.loaded("llama-gqa")

    monkeypatch.setattr(specs, "load_model", fake_load)  # where the app loads through
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


def test_token_comes_from_the_environment_when_none_is_typed(monkeypatch):
    seen: dict = {}

    def capture(*args, **kwargs):
        seen.update(kwargs)
        raise GatedRepoError("401", response=http_response(401))

    monkeypatch.setattr(tf.AutoConfig, "from_pretrained", capture)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    with pytest.raises(attnviz.GatedModel) as info:
        attnviz.load_model("meta-llama/Llama-3.2-1B")
    assert seen["token"] == SECRET and SECRET not in str(info.value)


# -- safe defaults: the running server ---------------------------------------------------------
def test_streamlit_config_keeps_xsrf_and_cors_and_hides_tracebacks():
    import tomllib

    cfg = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert cfg.get("server", {}).get("enableXsrfProtection", True) is True
    assert cfg.get("server", {}).get("enableCORS", True) is True
    assert cfg.get("client", {}).get("showErrorDetails") in ("none", "type"), "tracebacks would reach users"
    shown = subprocess.run(
        [sys.executable, "-m", "streamlit", "config", "show"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert not re.search(r"^enable(XsrfProtection|CORS) = false", shown, re.M)
    assert re.search(r'^showErrorDetails = "(none|type)"', shown, re.M)


@pytest.fixture(scope="module")
def demo_server():
    from server import streamlit_server

    with streamlit_server(name="robustness-demo", env={"ATTNVIZ_DEMO": "1"}) as s:
        yield s


@pytest.mark.slow
def test_running_server_has_xsrf_on_and_refuses_foreign_origins(demo_server):
    import urllib.request

    req = urllib.request.Request(
        demo_server.url + "/_stcore/health", headers={"Origin": "http://evil.example"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
        assert "_streamlit_xsrf=" in (r.headers.get("Set-Cookie") or ""), "XSRF protection is off"
        assert r.headers.get("Access-Control-Allow-Origin") in (None, ""), "CORS lets any origin in"
    preflight = urllib.request.Request(
        demo_server.url + "/_stcore/health",
        method="OPTIONS",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "GET"},
    )
    with urllib.request.urlopen(preflight, timeout=10) as r:
        assert r.headers.get("Access-Control-Allow-Origin") in (None, "")


@pytest.mark.slow
def test_demo_server_offers_only_allowed_models_and_no_token_field(demo_server):
    """A traversal link on the public demo: a warning, the allowed model instead, no free model
    field and no token field; then the server answers the next link."""
    from server import run_session

    run = run_session(demo_server.url, urllib.parse.urlencode({"model": "../..", "text": VALID}))
    assert run.status == "FINISHED_SUCCESSFULLY" and not run.exceptions, run
    assert any("not offered on this server" in a for a in run.alerts), run.alerts
    pickers = [w for w in run.widgets if w["type"] == "selectbox" and w["label"] == "Model"]
    assert pickers and all(o.split(" ")[0] in attnviz.BUILTIN_MODELS for o in pickers[0]["options"]), pickers
    assert not [w for w in run.widgets if w["type"] == "text_input"], run.widgets  # no Hub id / path / token
    assert run.figures, "no chart for the allowed model"
    again = run_session(demo_server.url, urllib.parse.urlencode({"text": "the river bank"}))
    assert again.status == "FINISHED_SUCCESSFULLY" and again.figures and not again.exceptions


# -- engine: safe defaults and logging ----------------------------------------------------------
def test_trust_remote_code_is_not_a_load_argument():
    import inspect

    assert "trust_remote_code" not in inspect.signature(attnviz.load_model).parameters


def test_extraction_logs_model_tokens_path_and_time(lm, caplog):
    caplog.set_level(logging.INFO, logger="attnviz.extract")
    res = attnviz.extract(lm, "the bank of the river")
    lines = [r.getMessage() for r in caplog.records if r.name == "attnviz.extract"]
    assert len(lines) == 1
    pattern = rf"extract model=tiny-llama-gqa tokens={res.n_tokens} path={res.path} seconds=\d+\.\d+"
    assert re.fullmatch(pattern, lines[0]), lines[0]


def test_package_logs_and_never_prints():
    """attnviz logs through `logging`: no print() call outside the CLI entry points (ruff's T20
    checks the same; this also catches `sys.stdout.write`)."""
    import ast

    for py in (ROOT / "attnviz").rglob("*.py"):
        source = py.read_text()
        entry = py.name == "cli.py" or py.parent.name == "bench" or '__name__ == "__main__"' in source
        if entry:  # the command-line reports write to stdout by design
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                assert name not in ("print", "sys.stdout.write", "sys.stderr.write"), f"{py}:{node.lineno}"


if __name__ == "__main__":
    print(table())
