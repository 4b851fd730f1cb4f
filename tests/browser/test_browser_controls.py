"""The explorer's controls in a real browser (Debian's Chromium through Playwright) on a tiny
model (issue 31): a grid tile clicked before selects its head again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from browser_page import reran, wait_idle
from server import Server, streamlit_server, tiny_models_env
from test_browser_views import click_tile, head_title, no_errors, url

from ui.params import ExplorerParams

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TINY = "tiny:llama-gqa"  # 4 query heads in 2 KV groups
TEXT = "the bank of the river is near the financial bank"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """The app serving the tiny models too (`server.tiny_models_env`)."""
    with streamlit_server(name="browser_controls", env=tiny_models_env()) as s:
        yield s


def test_a_tile_clicked_before_selects_its_head_again(server, page):
    """Head 1, head 3, then head 1 again (the same point of its tile): each click opens its head
    (Plotly toggles a selected point off on a second click: that click was ignored)."""
    page.goto(url(server, ExplorerParams(model=TINY, text=TEXT, layer=1, head=0)))
    wait_idle(page)
    no_errors(page)
    for head in (1, 3, 1, 3):
        with reran(page):
            click_tile(page, f"tile head {head}")
        page.wait_for_function(f"() => /head={head}/.test(location.search)")
        assert f"layer 1 · head {head}" in head_title(page)


HOVER_JS = """(i) => {
  const spans = document.querySelectorAll('span.tok');
  const t0 = performance.now();
  spans[i].dispatchEvent(new MouseEvent('mouseenter'));
  const ms = performance.now() - t0;
  return {ms, n: spans.length, on: Array.from(spans).findIndex(s => s.classList.contains('on')),
          colours: Array.from(spans).map(s => s.style.background),
          info: document.getElementById('info').textContent};
}"""


def hover_frame(page, selector: str = "span.tok"):
    """The frame of a hover view (a Streamlit html component: an iframe of its own)."""
    for _ in range(600):
        for f in page.frames:
            if f != page.main_frame and f.query_selector(selector):
                return f
        page.wait_for_timeout(100)
    raise AssertionError("no hover view")


def test_hovering_a_token_colours_the_text_at_once(server, page):
    """The coloured text's hover view at ~500 tokens: hovering a token repaints every token by its
    row in the browser (no server round trip) in under 100 ms; a causal row leaves later tokens
    at the bottom colour."""
    text = "the bank of the river is near the financial bank and " * 24  # 458 tokens
    page.goto(url(server, ExplorerParams(model=TINY, text=text, layer=1, head=2, tview="text")))
    wait_idle(page)
    no_errors(page)
    frame = hover_frame(page)
    got = frame.evaluate(HOVER_JS, 40)
    assert got["n"] == 458 and got["on"] == 40, {k: got[k] for k in ("n", "on")}
    assert got["ms"] < 100, got["ms"]
    assert got["info"].startswith("(40) ") and "attends to" in got["info"]
    later = set(got["colours"][41:])
    assert later == {"rgb(68, 1, 84)"}, later  # causal: nothing after token 40 gets weight
    assert len(set(got["colours"][:41])) > 3
    frame.hover("span.tok >> nth=7")  # a real pointer over token 7
    assert frame.evaluate("() => document.querySelectorAll('span.tok')[7].classList.contains('on')")


LINES_JS = """(i) => {
  const left = document.querySelectorAll('#left div');
  if (!left.length) return null;
  const t0 = performance.now();
  left[i].dispatchEvent(new MouseEvent('mouseenter'));
  const ms = performance.now() - t0;
  const lines = Array.from(document.querySelectorAll('#svg line'));
  const right = document.querySelectorAll('#right div');
  const rowOf = y => Array.from(right).findIndex(d => Math.abs(d.offsetTop + d.offsetHeight / 2 - y) < 1);
  return {ms, n: left.length, from: lines.map(l => +l.getAttribute('y1')),
          fromRow: left[i].offsetTop + left[i].offsetHeight / 2,
          to: lines.map(l => rowOf(+l.getAttribute('y2')))};
}"""


def test_hovering_a_token_shows_only_its_lines(server, page):
    """BertViz's hover at 458 tokens: every line starts at the hovered token, goes to a token at
    or before it (causal), and the view redraws in under 100 ms, in the browser."""
    text = "the bank of the river is near the financial bank and " * 24  # 458 tokens
    page.goto(url(server, ExplorerParams(model=TINY, text=text, layer=1, head=2, tview="lines")))
    wait_idle(page)
    no_errors(page)
    frame = hover_frame(page, "#left div")
    for i in (40, 12):
        got = frame.evaluate(LINES_JS, i)
        assert got["n"] == 458 and got["ms"] < 100, (got["n"], got["ms"])
        assert got["from"] and set(got["from"]) == {got["fromRow"]}
        assert all(0 <= j <= i for j in got["to"]), got["to"]
