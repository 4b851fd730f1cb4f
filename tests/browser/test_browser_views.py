"""Clicks in a real browser (Debian's Chromium through Playwright) on the built-in smollm2-135m:
a grid tile selects the head, an overview thumbnail opens that head in the explorer, a token
selects the token. Screenshots of the new views at N≈100 and N≈2000 go to
test-output/screenshots/ (look at them)."""

from __future__ import annotations

import re

import pytest
from browser_page import WIDTH, alerts, reran, titles, wait_idle
from server import OUTPUT
from ws_client import run_session

from ui.params import AtlasParams, CompareParams, ExplorerParams, OverviewParams

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = OUTPUT / "screenshots"
SENTENCE = (
    "The old lighthouse keeper walked down to the river bank every morning, counted the boats, "
    "wrote the same line in his log and went back up the hill before the bank opened. "
)
TEXT_100 = SENTENCE * 3  # ~100 tokens
TEXT_2000 = SENTENCE * 60  # ~2000 tokens


def url(server, params) -> str:
    return params.to_query().url(server.url, "" if isinstance(params, ExplorerParams) else path_of(params))


def path_of(params) -> str:
    return {
        OverviewParams: "Model_overview",
        CompareParams: "Compare",
        AtlasParams: "Head_atlas",
    }[type(params)]


def no_errors(page) -> None:
    assert not [a for a in alerts(page) if "Error" in a or "error" in a], alerts(page)


# Centre (in page pixels) of the n-th point of the trace named ``name`` in the chart at ``index``.
POINT_JS = """([index, name, n]) => {
  const gd = document.querySelectorAll('.js-plotly-plot')[index];
  const traces = Array.from(gd.querySelectorAll('g.trace'));
  const named = t => t.name === name || (t.name || '').startsWith(name + ' ');
  const tr = traces.find(t => t.__data__ && t.__data__[0] && t.__data__[0].trace
                              && named(t.__data__[0].trace));
  if (!tr) return null;
  const pts = tr.querySelectorAll('path.point, g.point > path');
  const r = pts[n].getBoundingClientRect();
  return [r.left + r.width / 2, r.top + r.height / 2];
}"""

CHART_INDEX_JS = """(name) => Array.from(document.querySelectorAll('.js-plotly-plot'))
  .findIndex(gd => (gd._fullData || [])
    .some(t => t.name === name || (t.name || '').startsWith(name + ' ')))"""


def click_point(page, name: str, n: int = 0) -> None:
    """Scroll the chart holding trace ``name`` into view and click its n-th point."""
    index = page.evaluate(CHART_INDEX_JS, name)
    assert index >= 0, f"no chart with a trace {name!r}"
    page.locator(".js-plotly-plot").nth(index).scroll_into_view_if_needed()
    xy = page.evaluate(POINT_JS, [index, name, n])
    assert xy, name
    page.mouse.click(xy[0], xy[1])


TILE_JS = """name => {  // a grid tile of the heatmaps element (ui/heatmaps.py) by its head's title
  for (const root of document.querySelectorAll('[data-testid=attnvizHeatmaps]')) {
    const d = root.__avhData, i = d ? d.panels.findIndex(p => 'tile ' + p.title === name
      || ('tile ' + p.title).startsWith(name + ' ')) : -1;
    if (i < 0 || d.panels.length < 2) continue;
    const r = root.querySelectorAll('.avh-img')[i].getBoundingClientRect();
    return [r.left + r.width * 0.45, r.top + r.height * 0.55];
  }
  return null;
}"""
COLOURBAR_JS = """() => {
  const bars = Array.from(document.querySelectorAll('.js-plotly-plot g.colorbar'))
    .map(g => g.getBoundingClientRect()).filter(r => r.width > 0);
  const last = bars[bars.length - 1];
  return last ? [last.width, last.height] : null;
}"""


def click_tile(page, name: str) -> None:
    """Click the middle of the grid tile of ``name`` ("tile head 3": the head's tile)."""
    page.locator("[data-testid=attnvizHeatmaps]").first.scroll_into_view_if_needed()
    xy = page.evaluate(TILE_JS, name)
    assert xy, name
    page.mouse.click(xy[0], xy[1])


def screenshot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    height = page.evaluate(
        """() => Math.max(...['[data-testid="stMain"]', '[data-testid="stAppViewContainer"]', 'body']
            .map(s => document.querySelector(s)).filter(Boolean).map(e => e.scrollHeight))"""
    )
    page.set_viewport_size({"width": WIDTH, "height": int(min(max(height, 800), 9000))})
    wait_idle(page)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    page.set_viewport_size({"width": WIDTH, "height": 1000})


def head_title(page) -> str:
    found = [t for t in titles(page) if re.search(r"layer \d+ · head \d+", t)]
    assert found, titles(page)
    return found[0]


# Each chart's title box against the chart's own box (page pixels): a title wider than the room
# left of it overflows the SVG and is cut at the edge.
TITLE_BOXES_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(gd => {
  const t = gd.querySelector('.gtitle');
  if (!t || !t.textContent) return [];
  const r = t.getBoundingClientRect(), s = gd.querySelector('.main-svg').getBoundingClientRect();
  return [{text: t.textContent, left: r.left - s.left, right: s.right - r.right}];
}).concat(Array.from(document.querySelectorAll('[data-testid=attnvizHeatmaps] .avh-title')).map(t => {
  const r = t.getBoundingClientRect(), s = t.closest('[data-testid=attnvizHeatmaps]').getBoundingClientRect();
  return {text: t.textContent, left: r.left - s.left, right: s.right - r.right};
}))"""


def titles_fit(page) -> None:
    """Every chart title lies inside its chart (none is cut at the right or left edge)."""
    boxes = page.evaluate(TITLE_BOXES_JS)
    assert boxes
    cut = [b for b in boxes if b["left"] < 0 or b["right"] < 0]
    assert not cut, cut


def test_click_a_grid_tile_then_a_token(server, page):
    page.goto(url(server, ExplorerParams(text=TEXT_100, layer=3, head=0, tok=20)))
    wait_idle(page, timeout_ms=240_000)
    no_errors(page)
    assert "layer 3 · head 0" in head_title(page)
    with reran(page):
        click_tile(page, "tile head 5")  # the middle of the tile, not its corner square
    page.wait_for_function("() => /head=5/.test(location.search)")
    assert "layer 3 · head 5" in head_title(page)
    with reran(page):
        page.locator('[data-testid="stButtonGroup"] button', has_text="coloured text").click()
    bar = page.evaluate(COLOURBAR_JS)  # the coloured text's colour bar: a readable strip
    assert bar and bar[0] >= 200 and bar[1] >= 10, bar
    with reran(page):
        click_point(page, "tokens", 25)  # the coloured text: token 25
    page.wait_for_function("() => /tok=25/.test(location.search)")
    assert page.locator('input[aria-label="Token position"]').input_value() == "25"
    titles_fit(page)
    screenshot(page, "views_explorer_n100")


def test_click_an_overview_thumbnail_opens_that_head(server, page):
    page.goto(url(server, OverviewParams(text=TEXT_100)))
    wait_idle(page, timeout_ms=240_000)
    no_errors(page)
    # the rollout's flow map and strip: log10 colour by default, from below 1e-5 (SmolLM2's flow
    # off the sink) up to 1
    ranges = page.evaluate(
        """() => Array.from(document.querySelectorAll('.js-plotly-plot'))
             .filter(gd => /(flow into|sources of)/.test(gd._fullLayout.title.text || ''))
             .map(gd => [gd._fullData[0].zmin, gd._fullData[0].zmax])"""
    )
    assert len(ranges) == 2 and all(lo <= -5 and hi == 0 for lo, hi in ranges), ranges
    titles_fit(page)
    screenshot(page, "views_overview_n100")
    n_layers = 30  # smollm2-135m: 30 layers x 9 heads; the mosaic's panels run layers across
    layer, head = 12, 4
    tile = page.locator(f'img.avh-img[data-panel="{head * n_layers + layer}"]')
    tile.scroll_into_view_if_needed()
    tile.hover()  # the hovered tile shows enlarged (ui.heatmaps' preview), beside it, not over it
    shown = "() => (document.querySelector('body > .avh-preview') || {style: {}}).style.display === 'block'"
    page.wait_for_function(shown)
    preview = page.evaluate(
        """() => { const b = document.querySelector('body > .avh-preview'), r = b.getBoundingClientRect();
                 return {title: b.children[0].textContent, left: r.left, right: r.right}; }"""
    )
    box = tile.bounding_box()
    assert preview["title"].startswith("L12 H4"), preview
    assert preview["left"] >= box["x"] + box["width"] or preview["right"] <= box["x"], (preview, box)
    tip = page.evaluate("() => document.querySelector('body > .avh-tip').textContent")
    assert tip.startswith("L12 H4") and re.search(r"weight -?\d+\.\d+$", tip), tip  # the cell's value
    with reran(page):
        tile.click()
    page.get_by_role("heading", name="Attention explorer").wait_for(timeout=240_000)
    wait_idle(page, timeout_ms=240_000)
    screenshot(page, "views_explorer_after_thumbnail_click")
    assert page.get_by_role("heading", name="Attention explorer").count() == 1
    assert "layer=12" in page.url and "head=4" in page.url, page.url
    assert "layer 12 · head 4" in head_title(page)


def test_long_text_views(server, page):
    """N≈2000: the auto scale is log and says so; on a laptop-width window (1100 px) the big
    head's title stays inside its chart (long token labels push the plot area right, and a title
    anchored there ran past the chart's edge)."""
    page.set_viewport_size({"width": 1100, "height": 1000})
    page.goto(url(server, ExplorerParams(text=TEXT_2000, layer=5, head=2, tok=1500)))
    wait_idle(page, timeout_ms=480_000)
    no_errors(page)
    assert page.get_by_text("Auto colour scale").count() > 0
    assert re.search(r"smollm2-135m · layer 5 · head 2", head_title(page))
    titles_fit(page)
    screenshot(page, "views_explorer_n2000")


def test_the_first_view_of_a_long_text_is_the_big_head(server):
    """Past 300 tokens (log colour: the big head needs no maximum from the grid) the server sends
    the big head before the grid, whose pooling covers every head: the first heatmap a person
    sees comes sooner. A short text (linear, one shared range) sends the grid first."""
    import urllib.parse

    def first_figure(text: str) -> dict:
        query = urllib.parse.urlencode(ExplorerParams(text=text, head=4).to_query().params)
        run = run_session(server.url, query, timeout=600)
        assert run.status == "FINISHED_SUCCESSFULLY" and not run.exceptions, run
        return run.figures[0]

    long_first = first_figure(SENTENCE * 12)  # ~420 tokens
    assert "layer 0 · head 4" in long_first["layout"].get("title", {}).get("text", "")
    assert len(long_first["data"]) == 1
    short_first = first_figure(SENTENCE)
    assert len([t for t in short_first["data"] if t["type"] == "heatmap"]) == 9  # the grid


def test_compare_and_atlas_screens(server, page):
    page.goto(url(server, CompareParams(text="the cat sat on the mat", text2="the big cat sat on a mat")))
    wait_idle(page, timeout_ms=240_000)
    no_errors(page)
    screenshot(page, "views_compare_aligned")
    page.goto(url(server, CompareParams(cmp="two models", model2="minilm-l6")))
    wait_idle(page, timeout_ms=240_000)
    no_errors(page)
    assert page.get_by_text("matched statistics").count() > 0
    screenshot(page, "views_compare_two_models")
    page.goto(url(server, AtlasParams(ntexts=8)))
    wait_idle(page, timeout_ms=240_000)
    run = page.get_by_role(
        "button", name=re.compile("(Run|Resume) the atlas")
    )  # the disk cache may hold some
    if run.count():
        with reran(page, timeout_ms=480_000):
            run.click()
    # a finished run calls st.rerun() to draw the atlas without its buttons: the page may look idle
    # for a moment between the two runs, so wait for the table itself
    page.wait_for_selector('[data-testid="stDataFrame"]', timeout=240_000)
    wait_idle(page, timeout_ms=240_000)
    no_errors(page)
    assert page.locator('[data-testid="stDataFrame"]').count() > 0
    screenshot(page, "views_atlas")


MARK_IMAGES_JS = """() => document.querySelectorAll('[data-testid=attnvizHeatmaps]').forEach(root =>
  root.querySelectorAll('.avh-img').forEach(im => { im.__mark = 1; }))"""
KEPT_JS = """() => Array.from(document.querySelectorAll('[data-testid=attnvizHeatmaps]')).map(root => {
  const ims = Array.from(root.querySelectorAll('.avh-img'));
  return {title: root.querySelector('.avh-title').textContent,
          heatmaps: ims.length, kept: ims.filter(im => im.__mark !== undefined).length};
})"""


def test_a_head_change_redraws_the_head_not_the_grid(server, page):
    """A head change (the Head box) reruns only the big head's fragment: the browser keeps the
    layer grid's heatmaps as they were drawn and draws the new head."""
    page.goto(url(server, ExplorerParams(text=TEXT_100, layer=2, head=0)))
    wait_idle(page, timeout_ms=240_000)
    no_errors(page)
    page.evaluate(MARK_IMAGES_JS)
    with reran(page):
        page.locator('[data-testid="stSelectbox"]').filter(has_text="Head").first.click()
        page.get_by_role("option", name="head 4", exact=True).click()
    page.wait_for_function("() => /head=4/.test(location.search)")
    charts = page.evaluate(KEPT_JS)
    grid = next(c for c in charts if c["heatmaps"] > 1)
    head = next(c for c in charts if "head 4" in c["title"])
    assert grid["kept"] == grid["heatmaps"], charts  # not one of the grid's heatmaps redrawn
    assert head["kept"] == 0, charts  # the big head is the new one
