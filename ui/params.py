"""Each page's parameters as one frozen dataclass, and its URL form: the one place a view is
read from and written to a link.

`Params.from_query` parses a link (a bad value is dropped with a message and the default kept);
`Params.to_query` writes one. Long texts travel compressed (deflate + URL-safe base64) in
``tz`` / ``tz2`` beside the readable ``text`` / ``text2`` of short ones, so any text the app
accepts (`MAX_TEXT_CHARS`) has a link as long as it fits `LINK_BUDGET` once compressed; past
that, `to_query` leaves the text out and says so (`Query.left_out`).

Options a control shows come from one ``Literal`` (``get_args``), never a second list.
The Hugging Face token is never a parameter, so it cannot reach a URL.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import attnviz
from attnviz.atlas import STATISTICS as ATLAS_STATISTICS
from attnviz.errors import AttnvizError
from attnviz.explain import DEFAULT_THRESHOLD
from attnviz.explain import MODES as ABLATION_MODES
from attnviz.figures import COLORSCALES, DIRECTIONS, POOLS
from attnviz.loading.names import check_id
from attnviz.metrics import METRICS
from ui.choices import (
    CHANGES,
    COMPARE_MODES,
    COMPARE_SCALES,
    EXPLAIN_VIEWS,
    EXPLORER_SCALES,
    GEN_ROWS,
    PATCH_DIRECTION_CHOICES,
    PATCH_OVER_CHOICES,
    QK_BY_CHOICES,
    SCALE_CHOICES,
    SCRATCH_MODES,
    STACKS,
    TOKEN_VIEWS,
)
from ui.link_text import MAX_TEXT_CHARS, Query, pack_text, unpack_text

DEFAULT_TEXT = "the financial bank is located on river bank"
DEFAULT_TEXT_B = "the river bank is located near the financial bank"
PLAIN_TEXT_CHARS = 2_000  # texts up to this length stay readable in a link; longer ones are compressed
LINK_BUDGET = 60_000  # characters of query string a link may have (browsers and the server take more)


# Field codecs: parse(raw) -> value (ValueError says what to use), dump(value) -> raw


def _bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in {"1", "true", "yes", "on"}:
        return True
    if low in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError("use 1 or 0")


def _int(lo: int = 0, hi: int = 1_000_000) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError("use a whole number") from None
        if not lo <= value <= hi:
            raise ValueError(f"use {lo}..{hi}")
        return value

    return parse


def _float(lo: float, hi: float) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ValueError("use a number") from None
        if not lo <= value <= hi:
            raise ValueError(f"use {lo}..{hi}")
        return value

    return parse


def _choice(options: Sequence[str]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in options:
            raise ValueError("use one of " + ", ".join(repr(o) for o in options if o))
        return raw

    return parse


def _text(raw: str) -> str:
    if len(raw) > MAX_TEXT_CHARS:
        raise ValueError(f"at most {MAX_TEXT_CHARS} characters")
    return raw


def _spec(raw: str) -> str:
    spec = raw.strip()
    try:  # the engine's one rule for model names (whether paths are served is decided on load)
        check_id(spec, allow_local=True)
    except AttnvizError as err:
        raise ValueError(str(err)) from None
    return spec


def _heads(raw: str) -> str:
    """Heads as ``layer.head`` pairs, comma-separated ("15.3,20.1"); "" for none."""
    pairs = [x.strip() for x in raw.split(",") if x.strip()]
    if len(pairs) > 64:
        raise ValueError("at most 64 heads")
    for pair in pairs:
        layer, _, head = pair.partition(".")
        if not (layer.isascii() and layer.isdigit() and head.isascii() and head.isdigit()):  # not '²', '١'
            raise ValueError("use layer.head pairs like 3.1,5.0")
    return ",".join(pairs)


def _edge(raw: str) -> str:
    """A routes graph's clicked mark: ``layer.head.source.target`` (an attention edge) or with
    ``.part`` (a node: head -1)."""
    if not raw:
        return ""
    parts = raw.split(".")
    nums, part = parts[:4], parts[4:]
    if (
        len(parts) not in (4, 5)
        or not all(n.isascii() and n.lstrip("-").isdigit() for n in nums)  # not '²', '١'
        or not all(x.isascii() and x.isalpha() for x in part)
    ):
        raise ValueError("use layer.head.source.target, like 3.1.4.7")
    return raw


def _short_text(raw: str) -> str:
    if len(raw) > 64:
        raise ValueError("at most 64 characters")
    return raw


def _spec_or_empty(raw: str) -> str:
    return _spec(raw) if raw.strip() else ""


def _dump(value: Any) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


def _legacy_scale(
    parsed: Any, applied: set[str], problems: list[Problem], query: Mapping[str, str]
) -> tuple[Any, set[str]]:
    """Links made before the one colour control carried switches (``log=1``, the explorer's
    ``perhead=1``) instead of ``scale``: a switch that is on becomes the scale (a link with
    ``scale`` keeps it; with several on, the last of `Params.LEGACY_SCALE`)."""
    for name, scale in type(parsed).LEGACY_SCALE.items():
        if name not in query or "scale" in query:
            continue
        try:
            on = _bool(query[name])
        except ValueError as err:
            problems.append(Problem(name, query[name], str(err), parsed.scale))
            continue
        if on:
            parsed, applied = parsed.replace(scale=scale), applied | {"scale"}
    return parsed, applied


def p(default: Any, parse: Callable[[str], Any], *, packed: str = "") -> Any:
    """A parameter field: its default, its parser and, for texts, the compressed twin's name."""
    return field(default=default, metadata={"parse": parse, "packed": packed})


@dataclass(frozen=True)
class Problem:
    """A link value that could not be read: the parameter, what the link had, why, and the value
    shown instead (in link form)."""

    name: str
    raw: str
    reason: str
    kept: str


@dataclass(frozen=True)
class Params:
    """The parameters every page shares: model, text and the chat template switch."""

    PAGE: ClassVar[str] = ""
    # switches of links made before the one colour control -> the scale each meant when on
    LEGACY_SCALE: ClassVar[dict[str, str]] = {}

    model: str = p(attnviz.DEFAULT_MODEL, _spec)
    text: str = p(DEFAULT_TEXT, _text, packed="tz")
    chat: bool = p(False, _bool)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def default(cls, name: str) -> Any:
        return next(f.default for f in dataclasses.fields(cls) if f.name == name)

    @classmethod
    def from_query(
        cls, query: Mapping[str, str], base: Self | None = None
    ) -> tuple[Self, set[str], list[Problem]]:
        """The parameters of a link over ``base`` (default: the defaults), the names the link
        set, and a `Problem` per value that could not be read (that one keeps its ``base``
        value). Unknown names are ignored."""
        base = base if base is not None else cls()
        values: dict[str, Any] = {f.name: getattr(base, f.name) for f in dataclasses.fields(cls)}
        applied: set[str] = set()
        problems: list[Problem] = []
        for f in dataclasses.fields(cls):
            packed = f.metadata.get("packed", "")
            for name, parse in ((f.name, f.metadata["parse"]), (packed, unpack_text)):
                if not name or name not in query:
                    continue
                try:
                    values[f.name] = parse(query[name])
                    applied.add(f.name)
                except ValueError as err:
                    problems.append(Problem(name, query[name], str(err), _dump(values[f.name])))
        parsed = cls(**values)
        if cls.LEGACY_SCALE:
            parsed, applied = _legacy_scale(parsed, applied, problems, query)
        return parsed, applied, problems

    def to_query(self, budget: int = LINK_BUDGET) -> Query:
        """The link form: every parameter; a long text compressed, and left out (named in
        ``left_out``) when the link would pass ``budget`` characters."""
        out: dict[str, str] = {}
        texts: list[tuple[str, str, str]] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            packed = f.metadata.get("packed", "")
            if packed and len(value) > PLAIN_TEXT_CHARS:
                texts.append((f.name, packed, pack_text(value)))
            else:
                out[f.name] = _dump(value)
        left: list[str] = []
        size = len(urllib.parse.urlencode(out, quote_via=urllib.parse.quote))
        for name, packed, raw in sorted(texts, key=lambda t: len(t[2])):
            if size + len(packed) + len(raw) + 2 > budget:
                left.append(name)
                continue
            out[packed] = raw
            size += len(packed) + len(raw) + 2
        return Query(out, tuple(left))

    def replace(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ExplorerParams(Params):
    PAGE: ClassVar[str] = "Explorer"
    LEGACY_SCALE: ClassVar[dict[str, str]] = {"log": "log", "perhead": "perhead"}

    stack: str = p("", _choice(STACKS))
    layer: int = p(0, _int())
    head: int = p(0, _int())
    cmap: str = p("Viridis", _choice(COLORSCALES))
    hide: bool = p(False, _bool)
    nosink: bool = p(False, _bool)
    row0: int = p(0, _int())
    # auto: log past LONG_TEXT_TOKENS tokens; perhead: auto's scale, each head on its own range
    scale: str = p("auto", _choice(EXPLORER_SCALES))
    vw: bool = p(False, _bool)  # value-weighted attention
    tok: int = p(-1, _int(-1))  # the token of the token views; -1: the last token
    tview: str = p("lines", _choice(TOKEN_VIEWS))  # which token view is drawn
    topk: int = p(3, _int(1, 10))  # the lines view: links drawn per head
    tdir: str = p("from", _choice(DIRECTIONS))
    pool: str = p("max", _choice(POOLS))  # how a long text's blocks are pooled: max or mean
    zoom: bool = p(False, _bool)  # a long text's head view: one region at full resolution
    zq: int = p(0, _int())  # the region's first query position
    zk: int = p(0, _int())  # its first key position
    zn: int = p(256, _int(8, 632))  # its side (tokens)
    block: int = p(-1, _int(-1))  # hybrids / recurrent models: the block picker's (-1: layer's block)


@dataclass(frozen=True)
class OverviewParams(Params):
    PAGE: ClassVar[str] = "Model overview"
    LEGACY_SCALE: ClassVar[dict[str, str]] = {"log": "log"}

    stack: str = p("", _choice(STACKS))
    cmap: str = p("Viridis", _choice(COLORSCALES))
    scale: str = p("auto", _choice(SCALE_CHOICES))  # auto: log past LONG_TEXT_TOKENS tokens
    metric: str = p("entropy", _choice(METRICS))
    pool: str = p("max", _choice(POOLS))  # how a long text's blocks are pooled: max or mean


@dataclass(frozen=True)
class ScratchParams(Params):
    PAGE: ClassVar[str] = "From scratch"

    mode: str = p("real layer", _choice(SCRATCH_MODES))
    layer: int = p(0, _int())
    head: int = p(0, _int())
    wstep: str = p("probs", _text)
    change: str = p("none", _choice(CHANGES))
    toy_d: int = p(32, _int(4, 512))
    toy_h: int = p(4, _int(1, 16))
    toy_n: int = p(8, _int(2, 64))
    toy_causal: bool = p(True, _bool)
    toy_seed: int = p(0, _int(0, 10_000))
    scale: str = p("auto", _choice(SCALE_CHOICES))  # the weights step's colour scale
    rq: int = p(-1, _int(-1))  # rotary bands: the query (-1: the last token)
    rk: int = p(-1, _int(-1))  # and the key (-1: the one the head attends to most)


@dataclass(frozen=True)
class CompareParams(Params):
    PAGE: ClassVar[str] = "Compare"

    cmp: str = p("two texts", _choice(COMPARE_MODES))
    text2: str = p(DEFAULT_TEXT_B, _text, packed="tz2")
    model2: str = p("", _spec_or_empty)
    stack: str = p("", _choice(STACKS))
    layer: int = p(0, _int())
    head: int = p(0, _int())
    cmap: str = p("Viridis", _choice(COLORSCALES))
    scale: str = p("auto", _choice(COMPARE_SCALES))


@dataclass(frozen=True)
class GenerationParams(Params):
    PAGE: ClassVar[str] = "Generation"
    LEGACY_SCALE: ClassVar[dict[str, str]] = {"log": "log"}

    k: int = p(8, _int(1, 64))
    stack: str = p("", _choice(STACKS))
    gstep: int = p(1, _int(1, 64))
    layer: int = p(0, _int())
    grow: str = p("new token", _choice(GEN_ROWS))
    sample: bool = p(False, _bool)  # sampling instead of greedy decoding
    temp: float = p(1.0, _float(0.05, 5.0))
    topp: float = p(0.95, _float(0.01, 1.0))
    seed: int = p(0, _int(0, 2**31 - 1))
    cmap: str = p("Viridis", _choice(COLORSCALES))
    scale: str = p("auto", _choice(SCALE_CHOICES))


@dataclass(frozen=True)
class AtlasParams(Params):
    PAGE: ClassVar[str] = "Head atlas"

    stat: str = p("previous_token", _choice(ATLAS_STATISTICS))
    ntexts: int = p(50, _int(1, 1000))


@dataclass(frozen=True)
class ExplainParams(Params):
    PAGE: ClassVar[str] = "Explain"

    view: str = p("routes", _choice(EXPLAIN_VIEWS))
    pos: int = p(-1, _int(-1))  # the position explained; -1: the last token (the prediction)
    thr: float = p(DEFAULT_THRESHOLD, _float(0.0, 0.5))  # routes: keep edges above this
    edge: str = p("", _edge)  # routes: the clicked edge or node (layer.head.source.target.part)
    lpos: int = p(16, _int(1, 64))  # logit lens: the last this many positions
    k: int = p(5, _int(1, 20))  # logit lens: top k
    target: str = p("", _short_text)  # attribution: this token's logit ("" = the prediction)
    contrast: str = p("", _short_text)  # attribution: minus this token's logit
    abl: str = p("", _heads)  # ablation: the heads, "layer.head,..."
    amode: str = p("zero", _choice(ABLATION_MODES))
    # patching (issue 33, ui/explain/patching.py): the corrupted prompt, the grid, direction, estimate or real
    corrupt: str = p("", _text, packed="tzc")
    over: str = p("heads", _choice(PATCH_OVER_CHOICES))
    pdir: str = p("denoise", _choice(PATCH_DIRECTION_CHOICES))
    pest: bool = p(False, _bool)  # attribution patching (an estimate) instead of real patches
    answer: str = p("", _short_text)  # "" = the clean prompt's prediction
    wrong: str = p("", _short_text)  # "" = the corrupted prompt's prediction
    sq: int = p(-1, _int(-1))  # head search: the query position (-1: the last token)
    sk: int = p(-1, _int(-1))  # head search: the key position (-1: the query token's previous
    # occurrence, else the token before it; key 0 is the sink column every head fills)
    # why this head attends (ui/explain/qk.py): the head, the key (-1: the one it attends to most), the split
    wl: int = p(0, _int())
    wh: int = p(0, _int())
    wk: int = p(-1, _int(-1))
    wby: str = p("part", _choice(QK_BY_CHOICES))

    def ablated(self) -> list[tuple[int, int]]:
        return [(int(a), int(b)) for a, _, b in (x.partition(".") for x in self.abl.split(",") if x)]
