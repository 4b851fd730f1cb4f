"""Cancel a long run in a real browser (Debian's Chromium through Playwright) on the built-in
smollm2-135m: the progress bar reports the forward layer by layer, a click on Cancel stops it
where it is (the extraction never completes: the server logs every finished extraction), the
page says "Cancelled" and keeps serving, and "Run again" draws the view of the same text.

No fixed sleeps: every step waits on what the page shows or on the server's log."""

from __future__ import annotations

import re

import pytest
from browser_page import alerts, chromium, reran, titles, wait_idle

from ui.params import ExplorerParams

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# ~3,000 tokens: 30 layers of a forward that takes seconds even on a quiet machine, so a click
# after the first reported layer lands long before the last one.
TEXT = (
    "The old lighthouse keeper walked down to the river bank every morning, counted the boats, "
    "wrote the same line in his log and went back up the hill before the bank opened. "
) * 90
EXTRACTED = re.compile(r"extract model=smollm2-135m tokens=(\d+)")


def extracted(log: str) -> list[int]:
    """Token counts of every extraction the server finished (attnviz.extract logs each one)."""
    return [int(n) for n in EXTRACTED.findall(log)]


def test_cancel_mid_run_then_run_again(server):
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
        page.goto(ExplorerParams(text=TEXT).to_query().url(server.url, ""))
        # the bar reports a finished attention layer: the forward is running
        bar = page.locator('[data-testid="stProgress"]').filter(has_text=re.compile(r"attention layer [1-9]"))
        bar.wait_for(timeout=600_000)
        text = bar.inner_text()
        done = int(re.search(r"attention layer (\d+) of (\d+)", text).group(1))
        total = int(re.search(r"attention layer \d+ of (\d+)", text).group(1))
        assert total == 30 and 1 <= done < total, text
        page.get_by_role("button", name="Cancel").click()
        page.get_by_text("Cancelled: nothing was kept").wait_for(timeout=180_000)
        wait_idle(page, 300_000)
        assert server.alive()
        assert not page.locator('[data-testid="stException"]').count()
        assert page.locator(".js-plotly-plot").count() == 0  # no view of a cancelled run
        n_tokens = [n for n in extracted(server.log()) if n > 1000]
        assert n_tokens == [], f"the cancelled forward finished: {server.log()[-2000:]}"

        with reran(page, timeout_ms=600_000):
            page.get_by_role("button", name="Run again").click()
        assert not [a for a in alerts(page) if "rror" in a or "Cancelled" in a], alerts(page)
        long_runs = [n for n in extracted(server.log()) if n > 1000]
        assert len(long_runs) == 1, long_runs  # one full extraction: the run again
        # the page's one-sentence summary: "smollm2-135m read N tokens through ..."
        summary = page.locator('[data-testid="stMain"] [data-testid="stMarkdownContainer"]')
        assert f" {long_runs[0]} tokens " in summary.filter(has_text=" tokens through ").first.inner_text()
        drawn = titles(page)
        assert any("smollm2-135m · layer 0 · head 0" in t for t in drawn), drawn
        page.context.close()
