"""The Explain page in a real browser (Debian's Chromium through Playwright) on the built-in
smollm2-135m: a click on an attention edge of the routes graph opens its head in the explorer;
screenshots of every view at the seed sentence and at ~2,000 tokens go to
test-output/screenshots/ (look at them)."""

from __future__ import annotations

import re

import pytest
from browser_page import alerts, chromium, reran, titles, wait_idle
from server import OUTPUT, streamlit_server

from ui.params import DEFAULT_TEXT, ExplainParams

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = OUTPUT / "screenshots"
WIDTH = 1440
SENTENCE = (
    "The old lighthouse keeper walked down to the river bank every morning, counted the boats, "
    "wrote the same line in his log and went back up the hill before the bank opened. "
)
TEXT_2000 = (SENTENCE * 60).rstrip()  # ~2000 tokens, ending on a word (not on a lone space token)
LONG_MS = 900_000  # a trace + routes of ~2000 tokens on a shared 2-core machine


@pytest.fixture(scope="module")
def server():
    with streamlit_server(name="explain") as s:
        yield s


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": WIDTH, "height": 1000})
    p = ctx.new_page()
    yield p
    ctx.close()


def url(server, params: ExplainParams) -> str:
    return params.to_query().url(server.url, "Explain")


def no_errors(page) -> None:
    assert not [a for a in alerts(page) if "rror" in a], alerts(page)


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


# Centre (page pixels) of the n-th point of the trace named ``name`` in the first chart holding it.
POINT_JS = """([name, n]) => {
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const tr = Array.from(gd.querySelectorAll('g.trace'))
      .find(t => t.__data__ && t.__data__[0] && t.__data__[0].trace && t.__data__[0].trace.name === name);
    if (!tr) continue;
    gd.scrollIntoView({block: 'center'});
    const r = tr.querySelectorAll('path.point')[n].getBoundingClientRect();
    return [r.left + r.width / 2, r.top + r.height / 2];
  }
  return null;
}"""


def chart_titles(page) -> list[str]:
    """Every chart's title as plain text (Streamlit's theme wraps it in <b>): Plotly charts and the
    heatmaps elements (the Explorer's grid and big head)."""
    return [re.sub(r"<[^>]+>", "", t) for t in titles(page)]


def test_click_a_graph_edge_opens_its_head_in_the_explorer(server, page):
    page.goto(url(server, ExplainParams(text=DEFAULT_TEXT)))
    wait_idle(page, timeout_ms=LONG_MS)
    no_errors(page)
    assert any(t.startswith("Routes to the prediction at (7) bank") for t in chart_titles(page)), (
        chart_titles(page)
    )
    screenshot(page, "explain_seed_routes")
    page.evaluate(POINT_JS, ["attention edge (click)", 0])  # scroll it into view first
    xy = page.evaluate(POINT_JS, ["attention edge (click)", 0])
    assert xy, "no attention edge to click"
    with reran(page):
        page.mouse.click(xy[0], xy[1])
    button = page.get_by_role("button", name=re.compile(r"Open layer \d+, head \d+"))
    label = button.inner_text()
    screenshot(page, "explain_seed_edge_picked")
    layer, head = (int(x) for x in re.search(r"layer (\d+), head (\d+)", label).groups())
    button.click()
    page.get_by_role("heading", name="Attention explorer").wait_for(timeout=240_000)
    wait_idle(page, timeout_ms=240_000)
    assert f"layer={layer}" in page.url and f"head={head}" in page.url, page.url
    assert any(f"layer {layer} · head {head}" in t for t in chart_titles(page)), chart_titles(page)
    screenshot(page, "explain_seed_edge_opened_in_explorer")


@pytest.mark.parametrize("view", ["logit lens", "attribution", "ablation"])
def test_the_other_views_at_the_seed_sentence(server, page, view):
    params = ExplainParams(text=DEFAULT_TEXT, view=view, abl="15.3,20.1" if view == "ablation" else "")
    page.goto(url(server, params))
    wait_idle(page, timeout_ms=LONG_MS)
    no_errors(page)
    want = {
        "logit lens": "Logit lens",
        "attribution": "Direct logit attribution",
        "ablation": "Next token at",
    }
    assert any(t.startswith(want[view]) for t in chart_titles(page)), chart_titles(page)
    screenshot(page, f"explain_seed_{view.replace(' ', '_')}")


def test_routes_and_lens_at_2000_tokens(server, page):
    page.goto(url(server, ExplainParams(text=TEXT_2000)))
    wait_idle(page, timeout_ms=LONG_MS)
    no_errors(page)
    title = next(t for t in chart_titles(page) if t.startswith("Routes"))
    n = int(re.search(r"at \((\d+)\)", title).group(1))
    assert n >= 1999, title
    screenshot(page, "explain_n2000_routes")
    page.goto(url(server, ExplainParams(text=TEXT_2000, view="logit lens")))
    wait_idle(page, timeout_ms=LONG_MS)
    no_errors(page)
    screenshot(page, "explain_n2000_lens")
    page.goto(url(server, ExplainParams(text=TEXT_2000, view="attribution")))
    wait_idle(page, timeout_ms=LONG_MS)
    no_errors(page)
    assert any(t.startswith("Direct logit attribution") for t in chart_titles(page)), chart_titles(page)
    screenshot(page, "explain_n2000_attribution")


def test_cancel_stops_a_long_trace_and_run_again_finishes_it(server, page):
    """A click on Cancel while the ~4,000-token trace runs stops it at the next layer: the page
    says it was cancelled and draws nothing; "Run again" then draws the routes."""
    text = (SENTENCE * 120).rstrip()
    page.goto(url(server, ExplainParams(text=text)))
    cancel = page.get_by_role("button", name="Cancel")
    cancel.wait_for(timeout=240_000)
    with reran(page, timeout_ms=LONG_MS):
        cancel.click()
    wait_idle(page, timeout_ms=LONG_MS)
    page.get_by_text("Cancelled: nothing was kept.").wait_for(timeout=60_000)
    assert not any(t.startswith("Routes") for t in chart_titles(page)), chart_titles(page)
    screenshot(page, "explain_cancelled")
    with reran(page, timeout_ms=LONG_MS):
        page.get_by_role("button", name="Run again").click()
    wait_idle(page, timeout_ms=LONG_MS)
    no_errors(page)
    assert any(t.startswith("Routes to the prediction") for t in chart_titles(page)), chart_titles(page)
