"""The page parameters (ui/params.py): every view survives its link, long texts compressed.

Pure functions, no Streamlit session: `from_query(to_query(p)) == p` for every page's dataclass,
any text up to the app's limit fits a link once compressed, and a text past the link budget is
named in ``left_out`` instead of silently dropped.
"""

from __future__ import annotations

import dataclasses
import random
import urllib.parse

import pytest

from ui import params as P
from ui.shell import PAGES

WORDS = [
    "the",
    "financial",
    "bank",
    "is",
    "located",
    "on",
    "river",
    "bank",
    "where",
    "attention",
    "heads",
    "look",
    "at",
    "tokens",
]


def prose(n_chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    out = " ".join(rng.choice(WORDS) + rng.choice(["", ",", ".", "\n"]) for _ in range(n_chars // 3))
    return out[:n_chars]


CHOICES = [o for opts in (P.STACKS, P.COLORSCALES, P.METRICS, P.SCRATCH_MODES, P.CHANGES,
    P.COMPARE_MODES, P.GEN_ROWS, P.TOKEN_VIEWS, P.EXPLAIN_VIEWS, P.ABLATION_MODES,
    *(v for k, v in vars(P).items() if k.endswith("_CHOICES")),
    *(v for k, v in vars(P.attnviz.figures).items() if k.isupper() and isinstance(v, tuple))) for o in opts
    if isinstance(o, str)]  # fmt: skip


def _parses(f: dataclasses.Field, raw: str) -> bool:
    try:
        f.metadata["parse"](raw)
    except ValueError:
        return False
    return True


def non_default(cls: type[P.Params]) -> P.Params:
    """An instance whose every field differs from its default (and still parses)."""
    changes = {}
    for f in dataclasses.fields(cls):
        d = f.default
        if isinstance(d, bool):
            changes[f.name] = not d
        elif isinstance(d, int):
            changes[f.name] = d + 1
        elif isinstance(d, float):
            changes[f.name] = d / 2
        elif f.name in ("model", "model2"):
            changes[f.name] = "tiny:qwen3"
        elif f.name in ("text", "text2", "corrupt"):
            changes[f.name] = "a [link](http://x) *and* ü 🙂\nnew line"
        elif f.name == "wstep":
            changes[f.name] = "scores_raw"
        elif f.name in ("target", "contrast", "answer", "wrong"):  # Explain's attribution/patching tokens
            changes[f.name] = " bank" if f.name in ("target", "answer") else " river"
        elif f.name == "abl":  # Explain's ablated heads
            changes[f.name] = "3.1,5.0"
        elif f.name == "edge":  # Explain's clicked route (an attention edge)
            changes[f.name] = "2.1.4.7"
        else:  # a choice: another option that its parser accepts
            changes[f.name] = next(o for o in CHOICES if o != d and _parses(f, o))
    return cls(**changes)


@pytest.mark.parametrize("cls", [e.params for e in PAGES], ids=lambda c: c.__name__)
def test_every_field_survives_its_link(cls):
    p = non_default(cls)
    assert all(getattr(p, f.name) != f.default for f in dataclasses.fields(cls))
    q = p.to_query()
    # through a real URL: percent-encoded, then parsed back as a browser would hand it over
    url = q.url("http://host", "x")
    back = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query, keep_blank_values=True))
    restored, applied, problems = cls.from_query(back)
    assert restored == p and not problems and applied == set(cls.names())


@pytest.mark.parametrize("n_chars", [P.PLAIN_TEXT_CHARS + 1, 50_000, P.MAX_TEXT_CHARS])
def test_any_accepted_text_fits_a_link_compressed(n_chars):
    text = prose(n_chars)
    q = P.CompareParams(text=text, text2=prose(n_chars, seed=1)).to_query()
    assert not q.left_out and "text" not in q.params and "tz" in q.params and "tz2" in q.params
    assert len(q.url("", "Compare")) <= P.LINK_BUDGET + 100
    restored, _, problems = P.CompareParams.from_query(q.params)
    assert not problems and restored.text == text and restored.text2 == prose(n_chars, seed=1)


def test_short_texts_stay_readable():
    q = P.ExplorerParams(text="the bank").to_query()
    assert q.params["text"] == "the bank" and "tz" not in q.params


def test_a_text_past_the_budget_is_named_not_dropped_silently():
    rng = random.Random(0)
    noise = "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(P.MAX_TEXT_CHARS))  # barely compresses
    q = P.ExplorerParams(text=noise, layer=3).to_query()
    assert q.left_out == ("text",) and "tz" not in q.params and "text" not in q.params
    assert q.params["layer"] == "3"  # the rest of the view still travels


def test_bad_values_are_reported_and_keep_the_base():
    base = P.ExplorerParams(layer=2, text="kept")
    restored, applied, problems = P.ExplorerParams.from_query(
        {"layer": "x", "head": "3", "tz": "not-zlib!", "cmap": "Nope"}, base
    )
    assert (
        restored.layer == 2 and restored.head == 3 and restored.text == "kept" and restored.cmap == "Viridis"
    )
    assert applied == {"head"}
    assert {p.name for p in problems} == {"layer", "tz", "cmap"}
    assert next(p for p in problems if p.name == "layer").kept == "2"


def test_a_compressed_bomb_is_refused_before_it_is_inflated():
    bomb = P.pack_text("a" * (P.MAX_TEXT_CHARS * 50))  # 3 MB of text in a few kB
    assert len(bomb) < 10_000
    with pytest.raises(ValueError, match="longer than"):
        P.unpack_text(bomb)
    cut = P.pack_text(prose(5_000))[:-40]
    with pytest.raises(ValueError):
        P.unpack_text(cut)
    assert P.unpack_text(P.pack_text("x 🙂")) == "x 🙂"
