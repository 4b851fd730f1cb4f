"""Share links (ui/params.py, ui/link_text.py) under generated values: a link is untrusted input
from anyone, and a text may be any Unicode up to the app's cap.

Each page's parameters are generated from the fields' own codecs (an integer field within its
bounds, a choice among its options, a text of any Unicode), so a new field is covered without a
change here."""

from __future__ import annotations

import dataclasses
import inspect
import urllib.parse

from hypothesis import given
from hypothesis import strategies as st
from property_settings import examples

from attnviz.loading.names import BUILTIN_MODELS
from ui import params as P
from ui.link_text import MAX_TEXT_CHARS, pack_text, unpack_text

PAGES = [
    P.Params,
    *(c for c in vars(P).values() if isinstance(c, type) and issubclass(c, P.Params) and c is not P.Params),
]
HUB_IDS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}/[A-Za-z0-9][A-Za-z0-9_-]{0,30}", fullmatch=True)
TEXTS = st.one_of(
    st.text(max_size=200),  # short: readable in the link
    st.text(min_size=P.PLAIN_TEXT_CHARS + 1, max_size=P.PLAIN_TEXT_CHARS + 100),  # compressed
    # up to the cap: a long repetitive text (compresses well) or a long varied one (may not fit)
    st.builds(
        lambda s, n: (s * n)[:MAX_TEXT_CHARS],
        st.text(min_size=1, max_size=50),
        st.integers(1, MAX_TEXT_CHARS),
    ),
)


def _closure(parse) -> dict:
    return inspect.getclosurevars(parse).nonlocals


def field_values(f: dataclasses.Field) -> st.SearchStrategy:
    """Values the field's codec accepts: from its parser (bounds and options read off it)."""
    parse = f.metadata["parse"]
    name = getattr(parse, "__qualname__", "")
    if name.startswith("_int."):
        bounds = _closure(parse)
        return st.integers(bounds["lo"], bounds["hi"])
    if name.startswith("_float."):
        bounds = _closure(parse)
        return st.floats(bounds["lo"], bounds["hi"], allow_nan=False)
    if name.startswith("_choice."):
        return st.sampled_from(_closure(parse)["options"])
    if parse is P._bool:
        return st.booleans()
    if parse is P._text:
        return TEXTS
    if parse is P._short_text:
        return st.text(max_size=64)
    if parse is P._heads:
        pair = st.tuples(st.integers(0, 99), st.integers(0, 99)).map(lambda lh: f"{lh[0]}.{lh[1]}")
        return st.lists(pair, max_size=64).map(",".join)
    if parse is P._edge:  # an edge (layer.head.source.target) or a node (head -1, with its part)
        n = st.integers(0, 99).map(str)
        edge = st.tuples(n, n, n, n).map(".".join)
        node = st.tuples(n, n, n, st.sampled_from(["attn", "mlp", "resid"])).map(
            lambda t: f"{t[0]}.-1.{t[1]}.{t[2]}.{t[3]}"
        )
        return st.one_of(st.just(""), edge, node)
    if parse is P._spec:
        return st.one_of(st.sampled_from(sorted(BUILTIN_MODELS)), HUB_IDS).filter(_accepted(parse))
    if parse is P._spec_or_empty:
        return st.one_of(st.just(""), st.sampled_from(sorted(BUILTIN_MODELS)), HUB_IDS).filter(
            _accepted(parse)
        )
    raise AssertionError(f"{f.name}: no strategy for its codec {name}; add one here")


def _accepted(parse):
    def ok(raw: str) -> bool:
        try:
            return parse(raw) == raw
        except ValueError:
            return False

    return ok


def page_params(cls: type[P.Params]) -> st.SearchStrategy:
    fields = {f.name: field_values(f) for f in dataclasses.fields(cls)}
    return st.builds(cls, **fields)


def through_a_browser(query: P.Query) -> dict[str, str]:
    """The link as a URL, read back the way Streamlit reads ``st.query_params`` (last value)."""
    url = query.url("http://127.0.0.1:8501", "Page")
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query, keep_blank_values=True))


@examples(80)
@given(cls=st.sampled_from(PAGES), data=st.data())
def test_every_pages_link_reads_back_as_the_same_params(cls, data):
    """Property: for every page, ``Params -> to_query -> URL -> from_query`` is the identity,
    over values drawn from each field's codec and texts of any Unicode up to the cap; a text
    whose compressed form does not fit the link budget is named in ``left_out`` and reads back
    as the default, and nothing else changes. No problem is reported for a link the app wrote."""
    params = data.draw(page_params(cls))
    query = params.to_query()
    back, applied, problems = cls.from_query(through_a_browser(query))
    assert problems == []
    expected = params.replace(**{name: cls.default(name) for name in query.left_out})
    assert back == expected
    assert applied == set(cls.names()) - set(query.left_out)


QUERY_NAMES = st.sampled_from(
    sorted({n for c in PAGES for n in c.names()} | {"tz", "tz2", "tzc", "log", "perhead"})
)


@examples(100)
@given(
    cls=st.sampled_from(PAGES),
    query=st.dictionaries(st.one_of(QUERY_NAMES, st.text(max_size=8)), st.text(max_size=80), max_size=8),
)
def test_any_string_as_a_link_is_read_or_refused_by_name(cls, query):
    """Property: any mapping of strings as a link's query is read, or each unreadable value is
    refused with a `Problem` naming the parameter it came from (a name in the link) and the
    value kept instead; never an exception. Every value read is one the field accepts."""
    parsed, applied, problems = cls.from_query(query)
    for pr in problems:
        assert pr.name in query and pr.raw == query[pr.name] and pr.reason
    assert applied <= set(cls.names())
    again, _, again_problems = cls.from_query(parsed.to_query().params)
    assert again_problems == [] and again == parsed  # what it read is a value a link can carry


@examples(60)
@given(raw=st.text(max_size=400))
def test_any_string_as_a_compressed_text_is_read_or_refused(raw):
    """Property: `unpack_text` of any string is a text within the cap, or a ValueError with a
    message (never another exception); `pack_text` then `unpack_text` is the identity."""
    try:
        text = unpack_text(raw)
    except ValueError as err:
        assert str(err)
    else:
        assert len(text) <= MAX_TEXT_CHARS
        assert unpack_text(pack_text(text)) == text


@examples(40)
@given(text=TEXTS)
def test_pack_then_unpack_is_the_identity_up_to_the_cap(text):
    """Property: every text the app accepts (any Unicode, up to `MAX_TEXT_CHARS`) survives
    compression unchanged."""
    assert unpack_text(pack_text(text)) == text


DIGITS = st.text(
    alphabet=st.one_of(st.sampled_from("0123456789"), st.characters(categories=("Nd", "No"))),
    min_size=1,
    max_size=3,
)
HEAD_LISTS = st.one_of(
    st.lists(st.tuples(DIGITS, DIGITS).map(".".join), max_size=4).map(",".join),
    st.text(alphabet=st.sampled_from("0123456789., ²١"), max_size=24),
)


@examples(100)
@given(raw=HEAD_LISTS)
def test_a_head_list_the_link_accepts_names_whole_heads(raw):
    """Property: a value of Explain's ``abl`` that the link accepts is a list of ``layer.head``
    pairs of ASCII digits, each read by `ExplainParams.ablated` as two integers (a digit-like
    character such as '²' or '١' is refused with the parameter's name, never accepted and then
    an exception in the page)."""
    parsed, _, problems = P.ExplainParams.from_query({"abl": raw})
    if problems:
        assert [pr.name for pr in problems] == ["abl"]
        return
    heads = parsed.ablated()
    assert ",".join(f"{layer}.{head}" for layer, head in heads) == parsed.abl
