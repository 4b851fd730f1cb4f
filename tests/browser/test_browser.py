"""The real thing in a real browser: `streamlit run app.py` on a loopback port, Debian's Chromium
through Playwright.

- The default view (built-in smollm2-135m) draws; changing layer and head redraws; the share
  link opened in a fresh browser context shows the same view (same heatmap, same numbers).
- Long texts survive their (compressed) share links, 6,000 and 50,000 characters.
- A screenshot of each page goes to test-output/screenshots/ (look at them).
- Text that looks like HTML, Markdown or LaTeX shows literally in the Plotly tick labels and
  never renders or runs (the rendering rows of docs/robustness.md).
"""

from __future__ import annotations

import re
import urllib.parse

import numpy as np
import pytest
from browser_page import WIDTH, alerts, charts, reran, tick_labels, wait_idle
from robustness_cases import BY_ID, PHISH
from server import OUTPUT
from test_browser_grid import TILES_JS, cell_centre, hover_lines

import attnviz
from attnviz.tokens import Tokens

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = OUTPUT / "screenshots"
PAGES = {  # screenshot name -> URL path (pages/ files; the Explorer is app.py)
    "explorer": "/",
    "model_overview": "/Model_overview",
    "from_scratch": "/From_scratch",
    "compare": "/Compare",
    "generation": "/Generation",
}


def head_view(page) -> dict:
    """The single-head heatmap (the one chart with one trace and a 'layer .. head ..' title)."""
    found = [c for c in charts(page) if c["traces"] == 1 and re.search(r"layer \d+ · head \d+", c["title"])]
    assert found, [c["title"] for c in charts(page)]
    return found[-1]


def screenshot(page, name: str) -> None:
    """The whole page, not only the viewport: Streamlit scrolls inside its main container, so the
    viewport is made as tall as the content for the shot."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    height = page.evaluate(
        """() => Math.max(...['[data-testid="stMain"]', '[data-testid="stAppViewContainer"]', 'body']
            .map(s => document.querySelector(s)).filter(Boolean).map(e => e.scrollHeight))"""
    )
    page.set_viewport_size({"width": WIDTH, "height": int(min(max(height, 800), 7000))})
    wait_idle(page)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    page.set_viewport_size({"width": WIDTH, "height": 1000})


def no_errors(page) -> None:
    bad = [a for a in alerts(page) if re.search(r"rror|went wrong|Traceback", a)]
    assert not bad, bad
    assert not page.locator('[data-testid="stException"]').count()


# -- issue 5: default view, layer/head, share link, screenshots ------------------------------------
def test_default_view_layer_head_and_share_link(server, browser, page):
    page.goto(server.url + "/")
    wait_idle(page)
    no_errors(page)
    first = head_view(page)
    assert "smollm2-135m · layer 0 · head 0" in first["title"]
    assert len(tick_labels(page)) > 0
    default_z = np.array(first["z"])
    assert np.allclose(default_z.sum(-1), 1, atol=1e-3)  # softmax rows

    layer = page.locator('input[type="range"][aria-label="Layer"]')
    layer.focus()
    with reran(page):  # waits for the run the key presses caused, not a fixed time
        for _ in range(7):
            page.keyboard.press("ArrowRight")
    with reran(page):
        page.locator('input[role="combobox"][aria-label="Head"]').click()
        page.get_by_role("option", name=re.compile(r"^head 4\b")).click()
    # polled on a timer: requestAnimationFrame (the default) can stall while the page is idle
    page.wait_for_function(
        "() => /layer=7/.test(location.search) && /head=4/.test(location.search)", polling=200
    )
    changed = head_view(page)
    assert "layer 7 · head 4" in changed["title"], changed["title"]
    assert not np.allclose(np.array(changed["z"]), default_z)

    page.get_by_text("Share this view").click()
    link = page.locator('[data-testid="attnvizShareLink"]').last.inner_text().strip()
    assert link.startswith(server.url) and "layer=7" in link and "head=4" in link, link
    assert "token" not in urllib.parse.parse_qs(urllib.parse.urlsplit(link).query)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    # the link is plain text (ui.share_link): its button copies it
    page.locator('[data-testid="attnvizShareCopy"]').last.click()
    assert page.evaluate("() => navigator.clipboard.readText()") == link
    screenshot(page, "explorer_layer7_head4")

    fresh = browser.new_context(viewport={"width": WIDTH, "height": 1000}).new_page()
    fresh.goto(link)
    wait_idle(fresh)
    no_errors(fresh)
    shared = head_view(fresh)
    assert shared["title"] == changed["title"]
    assert shared["x"] == changed["x"] and shared["y"] == changed["y"]
    assert np.array_equal(np.array(shared["z"]), np.array(changed["z"]))
    assert fresh.locator('input[type="range"][aria-label="Layer"]').input_value() == "7"
    fresh.context.close()


class HeldServer:
    """The page's Streamlit WebSocket through Playwright: what the server sends can be held back
    (``hold``) and let through later (``release``), as a slow network or a loaded server does."""

    def __init__(self, page) -> None:
        self.holding, self.held, self.to_browser = False, [], None
        page.route_web_socket(re.compile(r"/_stcore/stream"), self._route)

    def _route(self, ws) -> None:
        server = ws.connect_to_server()
        ws.on_message(server.send)
        self.to_browser = ws
        server.on_message(lambda m: self.held.append(m) if self.holding else ws.send(m))

    def hold(self) -> None:
        self.holding = True

    def release(self, n: int | None = None) -> None:
        """Send the first ``n`` messages held (all of them, and stop holding, without ``n``)."""
        if n is None:
            self.holding, n = False, len(self.held)
        out, self.held = self.held[:n], self.held[n:]
        for m in out:
            self.to_browser.send(m)

    def quiet(self, page, ms: int = 1500) -> int:
        """Until the server has sent something and then nothing for ``ms`` (its run is over);
        how many messages are held."""
        n = -1
        for _ in range(600):
            if self.held and len(self.held) == n:
                return n
            n = len(self.held)
            page.wait_for_timeout(ms)
        raise AssertionError("the server sent nothing")


def settled(page, slider) -> tuple[str, str, str]:
    """(slider, the link's layer, the big head's title) once the script is over and they agree."""
    page.wait_for_function(
        """() => document.querySelector('[data-testid="stApp"]').getAttribute('data-test-script-state')
                 === 'notRunning'""",
        polling=200,
    )
    for _ in range(300):
        got = (slider.input_value(), re.search(r"layer=(\d+)", page.evaluate("location.search"))[1],
               head_view(page)["title"])  # fmt: skip
        if got[0] == got[1] and f"layer {got[0]} ·" in got[2]:
            return got
        page.wait_for_timeout(200)
    raise AssertionError(f"the slider, the link and the drawing disagree: {got}")


WATCH_SLIDER_JS = """() => {
  window.__layers = [];
  setInterval(() => {
    const v = document.querySelector('input[type=range][aria-label="Layer"]').value;
    if (v !== window.__layers.at(-1)) window.__layers.push(v);
  }, 20);
}"""


def test_key_presses_during_a_run_all_count(server, page):
    """→ pressed three times while runs are on their way: the slider ends three layers on. A run
    used to send back the layer it started with as "set the slider to this"; arriving after the
    next press it put the slider back, and the press after counted from there (CI lost one of
    seven presses on a loaded machine; here it ended on 4, or showed 5, 4, 5). The server's
    messages are held to make that order; the slider's value is sampled every 20 ms."""
    net = HeldServer(page)
    page.goto(server.url + "/?layer=2&head=0")
    wait_idle(page)
    slider = page.locator('input[type="range"][aria-label="Layer"]')
    slider.focus()
    page.evaluate(WATCH_SLIDER_JS)
    net.hold()
    page.keyboard.press("ArrowRight")  # layer 3: its run is held back
    first = net.quiet(page)
    page.keyboard.press("ArrowRight")  # layer 4 in the browser, sent; its run is held
    net.release(first)  # the layer-3 run reaches the browser after the second press
    page.wait_for_timeout(500)  # a fixed time here makes the order, it waits for no result
    page.keyboard.press("ArrowRight")  # layer 5
    net.release()
    assert settled(page, slider)[0] == "5"
    seen = page.evaluate("window.__layers")
    assert seen == sorted(seen, key=int), f"the slider went back: {seen}"  # it showed 5, 4, 5


def long_text(n_chars: int, seed: int = 0) -> str:
    words = ["the", "bank", "river", "money", "flows", "near", "a", "quiet", "town,", "and", "it", "rains."]
    rng = np.random.default_rng(seed)
    return " ".join(words[i] for i in rng.integers(0, len(words), n_chars // 3))[:n_chars]


def test_long_texts_survive_their_share_links(server, browser, page):
    """Texts past the readable length travel compressed (``tz``): a 6,000-character text opens
    with the same view and numbers in a fresh context, and a 50,000-character text (more tokens
    than the server's cap) comes back into the text box character for character."""
    from ui.params import ExplorerParams

    text = long_text(6_000)
    link = ExplorerParams(text=text, stack="self", layer=3, head=2).to_query()
    assert "tz" in link.params and not link.left_out
    page.goto(link.url(server.url, ""))
    wait_idle(page, timeout_ms=240_000)
    no_errors(page)
    assert page.locator("textarea").first.input_value() == text
    view = head_view(page)
    assert "layer 3 · head 2" in view["title"], view["title"]
    page.get_by_text("Share this view").click()
    shared = page.locator('[data-testid="attnvizShareLink"]').last.inner_text().strip()
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(shared).query)["tz"] == [link.params["tz"]]

    big = long_text(50_000, seed=1)
    link = ExplorerParams(text=big, layer=1, head=1).to_query()
    url = link.url(server.url, "")
    assert not link.left_out and len(url) < 60_000
    fresh = browser.new_context(viewport={"width": WIDTH, "height": 1000}).new_page()
    fresh.goto(url)
    wait_idle(fresh, timeout_ms=240_000)
    assert fresh.locator("textarea").first.input_value() == big
    assert not fresh.locator('[data-testid="stException"]').count()
    assert re.search(
        r"(limit is|reads at most) [\d,]+", " ".join(alerts(fresh))
    )  # the cap's one-line message
    assert "tz=" in fresh.evaluate("() => location.search")
    fresh.context.close()


@pytest.mark.parametrize("name", list(PAGES))
def test_screenshot_of_each_page(server, page, name):
    page.goto(server.url + PAGES[name])
    wait_idle(page, timeout_ms=240_000)
    screenshot(page, name)
    no_errors(page)
    assert page.locator(".js-plotly-plot").count() > 0, f"{name}: no figure"
    empty = page.evaluate(
        "() => Array.from(document.querySelectorAll('.js-plotly-plot'))"
        ".filter(gd => !(gd._fullData || []).length).length"
    )
    assert empty == 0, f"{name}: {empty} empty figure(s)"


# -- issue 6: rendering cases ---------------------------------------------------------------------
PAYLOADS = {
    "html-bold": "<b>x</b> and <i>y</i>",
    "html-script": "<script>window.__xss=2</script>",
    "html-img-onerror": '<img src=x onerror="window.__xss=1">',
    "markdown": "**bold** _it_ [a](http://127.0.0.1:9/phish) # h",
    "latex": "$x^2$ \\(y\\) $$z$$",
    "html-entity": "&lt;b&gt; &amp; &#60;s&#62;",
}
LINKS = {"link-markdown": {"layer": PHISH}, "model-markdown": {"model": PHISH}}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(attnviz.loading.builtin_folder("smollm2-135m"))


def never_rendered(page) -> None:
    """Nothing the user typed became markup: no script ran, no dialog, no <img src=x>, no link to
    the phishing URL, no KaTeX, no bold/italic element made from the text."""
    assert page.evaluate("() => window.__xss") is None, "a script from the text ran"
    assert page.dialogs == []  # type: ignore[attr-defined]
    assert page.locator('img[src="x"]').count() == 0
    assert page.locator('a[href*="127.0.0.1:9"]').count() == 0
    assert page.locator('[data-testid="stMain"] .katex').count() == 0
    made = page.evaluate(
        """() => Array.from(document.querySelectorAll('b, strong, i, em, .js-plotly-plot tspan[style*=bold]'))
            .map(e => e.textContent.trim()).filter(t => ['x', 'y', 'bold', 'it', 'log in'].includes(t))"""
    )
    assert made == [], f"text rendered as markup: {made}"


@pytest.mark.parametrize("case_id", list(PAYLOADS))
def test_text_that_looks_like_markup_shows_literally(server, page, tokenizer, case_id):
    assert "browser" in BY_ID[case_id].levels
    text = PAYLOADS[case_id]
    page.goto(f"{server.url}/?{urllib.parse.urlencode({'text': text})}")
    wait_idle(page)
    no_errors(page)
    never_rendered(page)
    ids = tokenizer(text)["input_ids"]
    labels = [f"({i}) {d}" for i, d in enumerate(Tokens.build(tokenizer, ids).display)]
    view = head_view(page)
    # The big head is the heatmaps element (ui/heatmaps.js): it gets the tokens as they are and sets
    # them with textContent (Plotly needed them escaped)...
    assert view["x"] == labels
    page.wait_for_function(TILES_JS)  # ...and draws them literally: as labels where each has 12 px,
    if view["labels"]:
        page.wait_for_selector(".avh-xlabels div", state="attached")  # (laid out after it mounts)
        shown = tick_labels(page)
        for label in labels:
            assert label in shown, f"{label!r} not drawn literally; drawn: {shown[:40]}"
    else:  # else in the hover, every token on the diagonal
        big, n = page.evaluate(TILES_JS)["big"], len(labels)
        for i, label in enumerate(labels):
            lines = hover_lines(page, cell_centre(big, n, n, i, i))
            assert lines[1:3] == [f"query {label}", f"key {label}"], (label, lines)
    # The text area holds the text as typed.
    assert page.locator("textarea").first.input_value() == text
    # The app still answers a normal request in the same tab.
    page.goto(f"{server.url}/?text=the+bank+of+the+river")
    wait_idle(page)
    no_errors(page)
    assert "(1) bank" in tick_labels(page)


@pytest.mark.parametrize("case_id", list(LINKS))
def test_markdown_in_a_link_parameter_is_not_rendered(server, page, case_id):
    assert "browser" in BY_ID[case_id].levels
    page.goto(f"{server.url}/?{urllib.parse.urlencode(LINKS[case_id])}")
    wait_idle(page)
    never_rendered(page)
    messages = " ".join(alerts(page))
    assert "[log in](http://127.0.0.1:9/phish)" in messages, messages


def test_figure_builders_escape_whole_tag_tokens(browser):
    """Real tokenizers have tokens that are whole tags (<s>, </s>, <br>, <|im_start|>): Plotly
    would draw <b>/<s>/<br>/<a> in labels as markup. The builders' figures, drawn by plotly.js in
    Chromium, show every label literally."""
    from attnviz import figures as F

    labels = ["(0) <s>", "(1) <b>x</b>", "(2) <br>", "(3) <a href='http://127.0.0.1:9'>l</a>", "(4) &lt;"]
    probs = np.tril(np.ones((5, 5), dtype=np.float32))
    probs /= probs.sum(-1, keepdims=True)
    fig = F.head_heatmap(probs, labels, title="<b>t</b> · layer 0 · head 0")
    page = browser.new_page()
    page.set_content(fig.to_html(include_plotlyjs=True, full_html=True))
    page.wait_for_selector(".js-plotly-plot g.xtick text")
    shown = tick_labels(page)
    for label in labels:
        assert label in shown, f"{label!r} drawn as {shown}"
    assert page.locator('.js-plotly-plot a[href*="127.0.0.1:9"]').count() == 0
    page.close()
