"""The Explorer's grid in Chromium at 1280x800 (issue 40): the first screen holds the grid and the
big head, the open head is framed and the frame follows a head change, a hover on a tile shows
that head enlarged (`ui.explorer.grid_hover`)."""

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

TILES_JS = """() => {
  const gd = Array.from(document.querySelectorAll('.js-plotly-plot')).find(
    g => (g._fullData || []).some(t => (t.name || '').startsWith('tile ')));
  const big = Array.from(document.querySelectorAll('.js-plotly-plot')).find(
    g => /· head \\d/.test((g._fullLayout.title || {}).text || ''));
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const mark = document.querySelector('[data-testid=attnvizOpenHead]');
  return {grid: box(gd), big: box(big.querySelector('g.heatmaplayer image')),
          tiles: Array.from(gd.querySelectorAll('g.heatmaplayer image')).map(box),
          hrefs: Array.from(gd.querySelectorAll('g.heatmaplayer image')).map(i => i.getAttribute('href')),
          mark: mark && {head: mark.dataset.head, box: box(mark)}};
}"""


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with streamlit_server(name="browser_grid", env=tiny_models_env()) as s:
        yield s


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    yield ctx.new_page()
    ctx.close()


def framed(seen: dict, head: int) -> bool:
    m = seen["mark"]
    if not m or m["head"] != str(head):
        return False
    (x0, y0, x1, y1), (tx0, ty0, tx1, ty1) = m["box"], seen["tiles"][head]
    return x0 <= tx0 and y0 <= ty0 and x1 >= tx1 and y1 >= ty1 and (x1 - x0) < (tx1 - tx0) + 12


def test_the_first_screen_holds_the_grid_and_the_big_head_and_frames_the_open_head(server, page):
    page.goto(url(server, ExplorerParams(model=TINY, text=TEXT, layer=1, head=2)))
    wait_idle(page)
    no_errors(page)
    page.wait_for_selector("[data-testid=attnvizOpenHead]")
    seen = page.evaluate(TILES_JS)
    assert seen["grid"][3] <= 800 and seen["big"][3] <= 800, seen  # no scrolling to see them
    widths = [x1 - x0 for x0, _, x1, _ in seen["tiles"]]
    assert min(widths) >= 90, widths  # ~40 px tiles before issue 40
    assert framed(seen, 2), seen
    with reran(page):
        click_tile(page, "tile head 3")
    # a click draws the grid under a new key (`ui.clicks`): Plotly draws a new chart, the old
    # one's frame goes with it, and the component frames the new chart on its own run, after
    # Streamlit's run is over (so after `reran`): wait for the frame to exist and name head 3
    page.wait_for_function(
        "() => document.querySelector('[data-testid=attnvizOpenHead]')?.dataset.head === '3'"
    )
    assert "head 3" in head_title(page) and framed(page.evaluate(TILES_JS), 3)


def test_hovering_a_tile_shows_that_head_enlarged(server, page):
    page.goto(url(server, ExplorerParams(model=TINY, text=TEXT, layer=1, head=0)))
    wait_idle(page)
    page.wait_for_selector("[data-testid=attnvizOpenHead]")
    seen = page.evaluate(TILES_JS)
    x0, y0, x1, y1 = seen["tiles"][1]
    page.mouse.move((x0 + x1) / 2, (y0 + y1) / 2)
    preview = page.wait_for_selector("[data-testid=attnvizHeadPreview]", state="visible")
    img = preview.query_selector("img")
    assert img.get_attribute("src") == seen["hrefs"][1]  # head 1's own picture
    assert img.bounding_box()["width"] >= 2 * (x1 - x0) - 1  # enlarged
    assert "head 1" in preview.inner_text()
    page.mouse.move(5, 5)
    page.wait_for_selector("[data-testid=attnvizHeadPreview]", state="hidden")
