"""Cached model loading and extraction with visible progress, and errors shown with the fix.

- One `LoadedModel` per (model, token digest) is shared by every session: ``st.cache_resource``
  with at most `MAX_MODELS` entries. Loads without a token never get a model that another
  session loaded with its token (a gated model stays gated); the cache key holds only a keyed
  digest of the token, made with a per-process random secret, never the token itself.
- Results live in a byte-bounded LRU (`ResultCache`), keyed by model, text and options, so
  changing a layer, head or colour never reruns the model. Pages hand around a `ResultRef`, never
  the result: Streamlit keeps a session's fragments, download callables and widget format
  functions (and the page globals they reach) for minutes after the visitor leaves, so anything
  they hold lives outside the cache's bound. `result` / `result_now` fetch it at call time and
  run the model again after an eviction.
- Which models this server serves and how a name becomes a model are the engine's rules
  (`attnviz.server.specs`): this module asks, caches and draws.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import streamlit as st

import attnviz
from attnviz import AttentionResult, LoadedModel
from attnviz.extract import Sampling
from attnviz.figures.mixers import kind_name
from attnviz.inputs import Admission, admit
from attnviz.layout import AttentionLayout
from attnviz.server import env, specs
from attnviz.server.settings import settings
from ui import gate, progress
from ui.text import guarded, literal, md

log = logging.getLogger("attnviz.ui")


def _freeze_imports() -> None:
    """Streamlit collects garbage after every script run (``runner.postScriptGC``): a full
    collection walks every object the process holds, ~400,000 once torch, transformers and
    plotly are imported, ~0.2 s of every rerun on 2 shared cores (holding the GIL). Those live
    as long as the process: `gc.freeze` takes them out of the collector's walk, once, when this
    module is first imported (by the first script run, before any model or result exists).
    Objects made later are collected as before."""
    gc.freeze()


_freeze_imports()

MAX_MODELS = 2
RESULT_CACHE_BYTES = env.number("ATTNVIZ_RESULT_CACHE_MB") * 2**20
RESULT_CACHE_ENTRIES = 16
_SECRET = secrets.token_bytes(32)  # per process; never leaves memory

T = TypeVar("T")


def _model_key(token: str | None) -> str:
    """A keyed digest that separates token loads in the model cache; "" without a token."""
    if not token:
        return ""
    return hmac.new(_SECRET, token.encode(), hashlib.sha256).hexdigest()[:24]


def token_key(token: str | None) -> str:
    """The part of every result key that says whose it is: the token's keyed digest ("" without
    one) and, on a public demo, this visitor's own id, so a visitor never gets another's cached
    result (an instant answer would tell that someone ran this text recently)."""
    key = _model_key(token)
    return f"{key}|{gate.visitor()}" if settings().demo else key


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def _load_uncached(ms: specs.ModelSpec, token: str | None) -> LoadedModel:
    return specs.load(ms, token, settings())


@st.cache_resource(max_entries=MAX_MODELS, show_spinner=False)
def _cached_model(spec: str, token_digest: str, _token: str | None, _ms: specs.ModelSpec) -> LoadedModel:
    """The model of ``_ms`` (``spec`` resolved once by the caller, `specs.resolve`), one per spec
    and token digest; the underscore arguments are not part of the cache key."""
    lm = _load_uncached(_ms, _token)
    if settings().demo:  # engine code that takes lm.lock queues at the demo's one gate too
        lm.lock = gate.shared().lock(lm.lock)  # type: ignore[assignment]
    return lm


@st.cache_resource(show_spinner=False)
def _ready() -> set[tuple[str, str]]:
    """(spec, token digest) pairs loaded at least once in this process."""
    return set()


def mixer_line(lay: AttentionLayout) -> str:
    """Which mixer runs in which block, by the names the pages use ("Gated DeltaNet in blocks 0,
    2; softmax attention in blocks 1, 3"; "" when every block is softmax attention)."""
    return lay.mixer_summary(kind_name)


def describe_layout(lay: AttentionLayout) -> str:
    """One Markdown line: type, kind, layers x heads, KV heads, each block's token mixer where
    they are not all softmax attention, sizes (the type from the model's config is escaped)."""
    kind = md(lay.model_type)
    mixers = mixer_line(lay)
    if not lay.n_layers:  # a pure recurrent / state-space model (Mamba, RWKV, ...): no heads
        blocks = f"{len(lay.mixers)} blocks, no softmax attention ({mixers})"
        return f"{kind} · {lay.kind} · {blocks} · d_model {lay.d_model}"
    layers = f"{lay.n_layers} layer{'s' * (lay.n_layers != 1)}"
    text = f"{kind} · {lay.kind} · {layers} × {lay.n_heads} heads"
    if mixers:  # a hybrid: blocks first, the softmax layers are some of them ("1 layers" of 4 blocks)
        blocks = f"{max(lay.n_blocks, len(lay.mixers))} blocks: {mixers}"
        text = f"{kind} · {lay.kind} · {blocks} · softmax attention: {layers} × {lay.n_heads} heads"
    if lay.kind == "encoder-decoder":
        text = (
            f"{kind} · encoder {lay.n_layers} + decoder {lay.n_decoder_layers} layers × {lay.n_heads} heads"
        )
    if lay.group_size > 1:
        text += f" · {lay.n_kv_heads} KV heads (each shared by {lay.group_size} query heads)"
    if (
        not mixers and lay.attention_layers
    ):  # mixers not listed: say where the attention is, the rest has none
        blocks = ", ".join(map(str, lay.attention_layers))
        text += (
            f" · attention in blocks {blocks} of {lay.n_blocks}; the other blocks are recurrent / "
            "state-space, with no attention map"
        )
    return text + f" · d_model {lay.d_model}, head_dim {lay.head_dim}"


def load(spec: str, token: str | None = None) -> LoadedModel | None:
    """The shared cached model, with an ``st.status`` the first time (gone once loaded: a toast
    says how long it took); None after an error (already shown)."""
    spec = spec.strip()
    key = (spec, _model_key(token))
    shown = literal(spec)  # as typed, never Markdown or a link (labels and spinners are Markdown too)
    with guarded("loading the model", token, (spec,)):
        ms = specs.resolve(spec, settings())
        if key in _ready():
            with st.spinner(f"Loading {shown}…", show_time=True):
                return _cached_model(spec, key[1], token, ms)
        t0 = time.perf_counter()
        box = st.empty()
        with box.status(f"Loading {shown}…", expanded=True) as status:
            try:
                status.write(f"Model: {shown} ({ms.label}).")
                if ms.needs_conversion:
                    status.write(
                        "First run of the built-in SmolLM2: de-quantizing its GGUF file into "
                        "~/.cache/attnviz (about 25 s, only once)."
                    )
                status.write("Reading the config, the weights and the tokenizer…")
                with gate.turn():
                    lm = _cached_model(spec, key[1], token, ms)
                status.write(
                    f"{describe_layout(lm.layout)} on {lm.device}, {str(lm.dtype).removeprefix('torch.')}."
                )
            except BaseException:
                status.update(label=f"Could not load {shown}", state="error", expanded=False)
                raise
        box.empty()
        st.toast(f"Loaded {shown} in {time.perf_counter() - t0:.1f} s", icon=":material/check_circle:")
        for note in lm.notices:  # the engine's one-line notices: a cache rebuilt, or not written
            st.warning(md(note), icon=":material/build:")
        _ready().add(key)
        return lm
    return None


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


class ResultCache:
    """A thread-safe LRU bounded by entry count and by bytes (``AttentionResult.nbytes``)."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.evictions = 0  # entries dropped to stay within the bounds (the demo soak reads it)

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        with self._lock:
            self._items[key] = (value, nbytes)
            self._items.move_to_end(key)
            while len(self._items) > 1 and (
                len(self._items) > self.max_entries or self.total_bytes > self.max_bytes
            ):
                self._items.popitem(last=False)
                self.evictions += 1

    @property
    def total_bytes(self) -> int:
        return sum(n for _, n in self._items.values())

    def __len__(self) -> int:
        return len(self._items)


@st.cache_resource(show_spinner=False)
def results_cache() -> ResultCache:
    return ResultCache(RESULT_CACHE_ENTRIES, RESULT_CACHE_BYTES)


def result_key(
    lm: LoadedModel,
    token: str | None,
    text: str,
    *,
    chat: bool,
    generate: int = 0,
    sampling: Sampling | None = None,
) -> tuple:
    """What identifies a result: model, token digest, text and options (never the token)."""
    return (lm.spec, token_key(token), text, bool(chat), int(generate), settings().max_tokens, sampling)


def is_cached(key: tuple) -> bool:
    """A result under this `result_key` is in the cache (a page shows it without a new forward)."""
    return results_cache().get(key) is not None


@dataclass(frozen=True)
class ResultRef:
    """How to get a result back without holding it: what fragments and download callables keep.
    ``key`` is the result cache's key (a token digest, never the token); ``spec`` is what `load`
    was given and ``name`` the loaded model's name (for titles); ``token`` is this session's,
    kept for a re-run after an eviction and left out of ``repr``, equality and hashing."""

    key: tuple
    spec: str
    name: str
    text: str
    chat: bool
    generate: int = 0
    token: str | None = field(default=None, repr=False, compare=False)
    sampling: Sampling | None = None


def extract(
    lm: LoadedModel,
    text: str,
    *,
    spec: str | None = None,
    token: str | None = None,
    chat: bool = False,
    generate: int = 0,
    sampling: Sampling | None = None,
    statistics: bool = False,
    admission: Admission | None = None,
) -> tuple[AttentionResult, ResultRef] | tuple[None, None]:
    """(result, ref) from the cache or a fresh run with a spinner; (None, None) after an error.
    ``spec`` is what `load` was given for ``lm`` (default ``lm.spec``), for a re-run.
    ``statistics=True`` (a page that shows every head's statistics) has a fresh run keep them
    from the forward (`attnviz.extract`); it is not part of the key: any page reuses a cached
    result of the same text, with or without them (the statistics then take a second pass).
    ``admission``: the page's `attnviz.inputs.admit` of this text (`ui.shell.admitted`), so the
    text is not tokenized again; without one it is admitted here (a refusal is the message)."""
    key = result_key(lm, token, text, chat=chat, generate=generate, sampling=sampling)
    ref = ResultRef(key, (spec or lm.spec).strip(), lm.spec, text, bool(chat), int(generate), token, sampling)
    cache = results_cache()
    hit = cache.get(key)
    if hit is not None:
        return hit, ref
    name = md(lm.spec)
    what = f"generating {generate} tokens with {name}" if generate else f"running {name} on the text"
    if progress.cancelled(key):
        return None, None
    with guarded(what, token, (lm.spec, text)):
        if admission is None or admission.generate != int(generate):
            admission = admit(lm, text, chat=chat, generate=int(generate), max_tokens=settings().max_tokens)
        admission.check()  # over the cap, the position table or the free memory: a message
        n = admission.n_tokens
        with gate.turn() as check, progress.staged(f"{what[0].upper()}{what[1:]}", n, key) as report:
            res = _run(
                lm, ref, progress=gate.checked(report, check), statistics=statistics, admission=admission
            )
        cache.put(key, res, res.nbytes)
        return res, ref
    return None, None


def result(ref: ResultRef) -> AttentionResult | None:
    """The result of ``ref`` inside a script run (a page or a fragment): from the cache, or the
    model runs again with the usual spinner; None after an error (already shown)."""
    hit = results_cache().get(ref.key)
    if hit is not None:
        return hit
    lm = load(ref.spec, ref.token)
    if lm is None:
        return None
    res, _ = extract(
        lm,
        ref.text,
        spec=ref.spec,
        token=ref.token,
        chat=ref.chat,
        generate=ref.generate,
        sampling=ref.sampling,
    )
    return res


def result_now(ref: ResultRef) -> AttentionResult:
    """The result of ``ref`` outside a script run (a download's data callable runs in a worker
    thread): no ``st.`` calls; errors raise."""
    cache = results_cache()
    hit = cache.get(ref.key)
    if hit is not None:
        return hit
    log.info("result evicted; running %s again for a download", ref.spec)
    ms = specs.resolve(ref.spec, settings())
    lm = _cached_model(ref.spec, _model_key(ref.token), ref.token, ms)
    with gate.shared().turn() if settings().demo else contextlib.nullcontext():
        res = _run(lm, ref)
    cache.put(ref.key, res, res.nbytes)
    return res


def _run(
    lm: LoadedModel,
    ref: ResultRef,
    *,
    progress: Callable[[int, int], None] | None = None,
    statistics: bool = False,
    admission: Admission | None = None,
) -> AttentionResult:
    """The one engine call behind every result a page shows (a fresh run and a download's re-run
    after an eviction): the server's token cap and the self-check against eager ("auto"), so a
    re-run result carries the same checks as the one it replaces."""
    return attnviz.extract(
        lm,
        ref.text,
        chat=ref.chat,
        generate=ref.generate,
        max_tokens=settings().max_tokens,
        verify="auto",
        sampling=ref.sampling,
        progress=progress,
        statistics=statistics,
        admission=admission,
    )


def cached(name: str, key: Hashable, build: Callable[[], T], nbytes: Callable[[T], int] | None = None) -> T:
    """Derived values (pooled grids, metrics, walkthroughs) in a bounded per-process cache."""
    store = _derived()
    full = (name, key)
    hit = store.get(full)
    if hit is None:
        hit = build()
        store.put(full, hit, nbytes(hit) if nbytes else _size(hit))
    return hit


def _size(value: Any) -> int:
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(value, tuple):
        return sum(_size(v) for v in value)
    return 1024


@st.cache_resource(show_spinner=False)
def _derived() -> ResultCache:
    return ResultCache(max_entries=64, max_bytes=256 * 2**20)
