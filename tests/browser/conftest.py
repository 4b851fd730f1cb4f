"""Shared fixtures of the browser tests: the real app server (`streamlit run app.py` on a free
loopback port, one per module) and Debian's Chromium driven by Playwright."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_page import WIDTH, chromium
from server import Server, streamlit_server


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """The app served for one test module (its log: test-output/<module>.log)."""
    with streamlit_server(name=Path(request.path).stem.removeprefix("test_")) as s:
        yield s


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser):
    """A fresh page at the common width; the dialogs it raised are kept in ``page.dialogs``."""
    ctx = browser.new_context(viewport={"width": WIDTH, "height": 1000})
    p = ctx.new_page()
    p.dialogs = []
    p.on("dialog", lambda d: (p.dialogs.append(d.message), d.dismiss()))
    yield p
    ctx.close()
