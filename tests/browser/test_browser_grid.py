"""The Explorer's grid in Chromium at 1280x800 (issue 40): the first screen holds the grid and the
big head, the open head is framed and the frame follows a head change, a hover on a tile shows
that head enlarged, a hover on a cell gives its exact value and tokens, a click on a cell of the
big head asks why it attends there (`ui.heatmaps`: one element draws each)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from browser_page import reran, wait_idle
from server import Server, streamlit_server, tiny_models_env
from test_browser_views import click_tile, head_title, no_errors, url

from ui.params import ExplorerParams

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TINY = "tiny:llama-gqa"  # 4 query heads in 2 KV groups
TEXT = "the bank of the river is near the financial bank"

TILES_JS = """() => {  // the grid and the big head: heatmaps elements (ui/heatmaps.py)
  const roots = Array.from(document.querySelectorAll('[data-testid=attnvizHeatmaps]'));
  const grid = roots.find(r => r.__avhData.panels.length > 1), big = roots.find(r => r !== grid);
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const mark = grid.querySelector('[data-testid=attnvizOpenHead]');
  return {grid: box(grid), big: box(big.querySelector('.avh-img')),
          tiles: Array.from(grid.querySelectorAll('.avh-img')).map(box),
          hrefs: Array.from(grid.querySelectorAll('.avh-img')).map(i => i.getAttribute('src')),
          mark: mark && {head: mark.dataset.head, box: box(mark)}};
}"""
HOVER_JS = """() => { const t = document.querySelector('[data-testid=attnvizHover]');
  return t && t.style.display !== 'none' ? t.textContent.split('\\n') : null; }"""


def cell_centre(box: list[float], n_rows: int, n_cols: int, row: int, col: int) -> tuple[float, float]:
    x0, y0, x1, y1 = box
    return x0 + (col + 0.5) * (x1 - x0) / n_cols, y0 + (row + 0.5) * (y1 - y0) / n_rows


def hover_lines(page, xy: tuple[float, float]) -> list[str]:
    page.mouse.move(*xy)
    page.wait_for_function(HOVER_JS)
    return page.evaluate(HOVER_JS)


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
    # the click reruns the layer: the frame follows (in the browser, after Streamlit's run is over,
    # so after `reran`): wait for the frame to name head 3
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


def _engine():
    import tiny

    import attnviz

    return attnviz.extract(tiny.loaded("llama-gqa"), TEXT)


def test_the_hover_gives_each_cells_exact_value_and_tokens(server, page):
    """The big head and a grid tile are pictures: the hover reads the cell under the pointer from
    the float32 values shipped with it. At each cell's centre it shows the query and key tokens
    and the weight the engine computed (to the 4 decimals the Plotly hover printed)."""
    page.goto(url(server, ExplorerParams(model=TINY, text=TEXT, layer=1, head=2)))
    wait_idle(page)
    page.wait_for_selector("[data-testid=attnvizOpenHead]")
    res = _engine()
    head, layer, labels = res.head(1, 2), res.layer(1), list(res.tokens.labels)
    n = len(labels)
    seen = page.evaluate(TILES_JS)
    for row, col in ((n - 1, 0), (5, 2), (n - 1, n - 1), (3, 3)):
        lines = hover_lines(page, cell_centre(seen["big"], n, n, row, col))
        assert lines[1:] == [f"query {labels[row]}", f"key {labels[col]}", f"weight {head[row, col]:.4f}"], (
            row, col, lines,
        )  # fmt: skip
    # a tile of the grid: head 1's cell (6, 1), on the same shared colour scale
    lines = hover_lines(page, cell_centre(seen["tiles"][1], n, n, 6, 1))
    want = ["head 1 · kv 0", f"query {labels[6]}", f"key {labels[1]}", f"weight {layer[1][6, 1]:.4f}"]
    assert lines == want, lines


def test_a_click_on_a_cell_of_the_big_head_asks_why_it_attends_there(server, page):
    page.goto(url(server, ExplorerParams(model=TINY, text=TEXT, layer=1, head=2)))
    wait_idle(page)
    page.wait_for_selector("[data-testid=attnvizOpenHead]")
    n = len(_engine().tokens.labels)
    with reran(page):
        page.mouse.click(*cell_centre(page.evaluate(TILES_JS)["big"], n, n, 7, 2))
    link = page.get_by_text(re.compile(r"Why does head 2 attend from 7 to 2"))
    link.first.wait_for(timeout=60_000)


def test_the_png_button_saves_the_big_head_at_twice_its_size(server, page):
    """The element's "⬇ PNG" (what Plotly's camera button was): the view as drawn, at 2x, named."""
    from PIL import Image

    page.goto(url(server, ExplorerParams(model=TINY, text=TEXT, layer=1, head=2)))
    wait_idle(page)
    root = page.locator("[data-testid=attnvizHeatmaps]").nth(1)
    with page.expect_download() as got:
        root.locator(".avh-save").click()
    download = got.value
    assert download.suggested_filename == "attnviz_tiny-llama-gqa_L1_H2.png"
    img = Image.open(download.path()).convert("RGB")
    box = root.bounding_box()
    assert abs(img.width - 2 * box["width"]) <= 2 and abs(img.height - 2 * box["height"]) <= 2
    # the picture of the head is in it, drawn without smoothing: the top-left cell is query 0's
    # weight on key 0 (1.0, the top of the colour scale: Viridis yellow)
    pic = root.locator(".avh-img").bounding_box()
    x, y = int(2 * (pic["x"] - box["x"] + 2)), int(2 * (pic["y"] - box["y"] + 2))
    assert img.getpixel((x, y)) == (253, 231, 37), img.getpixel((x, y))
