"""The explorer's controls in a real browser (Debian's Chromium through Playwright) on a tiny
model (issue 31): a grid tile clicked before selects its head again."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from browser_page import reran, wait_idle
from server import OUTPUT, ROOT, Server, streamlit_server
from test_browser_views import click_tile, head_title, no_errors, url

from ui.params import ExplorerParams

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TINY = "tiny:llama-gqa"  # 4 query heads in 2 KV groups
TEXT = "the bank of the river is near the financial bank"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """The app serving the tiny models too (`tiny.register` in the server process, loaded as
    its sitecustomize): a page runs in a second, not a minute."""
    hook = OUTPUT / "tiny-hook"
    hook.mkdir(parents=True, exist_ok=True)
    (hook / "sitecustomize.py").write_text("import tiny\n\ntiny.register()\n")
    path = os.pathsep.join([str(hook), str(ROOT), str(ROOT / "tests")])
    with streamlit_server(name="browser_controls", env={"PYTHONPATH": path}) as s:
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
