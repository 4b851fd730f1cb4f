"""The page-costs half of scripts/bench_ui.py --browser: what each page and control costs at ~1.5k
tokens in Chromium against the real server, next to one plain forward of the same text.

One repeat, on one page of one browser, in the order a person clicks:

1. Explorer, a fresh text pasted and submitted: submit → page idle (every chart drawn).
2. A head change (the Head box) and a layer change (the Layer slider, one step): → idle.
3. Model overview, on the Explorer's cached result: link click → idle.
4. Back to the Explorer (a computed result): link click → idle.
5. Model overview, a fresh text submitted there: submit → idle (its forward keeps the statistics).
6. Generation of 8 tokens from that text as the prompt: link click → idle.

"Idle" is `tests/server.py`'s `wait_idle`: the script run is over, every rerun the page asked
for is answered, and every Plotly chart is drawn. After each timed page the bench process runs
one plain SDPA forward of the same text (the server is idle then); ratios are per repeat, medians
over repeats. Results go into docs/benchmarks.md between the ui-pages markers.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from bench_ui_common import forward_median, texts
from browser_page import script_runs, wait_idle

import attnviz
from attnviz.bench.common import replace_section

HEADER = (
    "| what (N tokens) | wall (median) | one plain forward of the text | ratio to the forward | target | "
    "load (1-min avg) |\n|---|---|---|---|---|---|"
)


def timed(page, act: Callable[[], None], timeout_ms: int = 900_000) -> float:
    """Seconds from ``act`` until the page is idle after a run that started after it."""
    before = script_runs(page)
    t0 = time.perf_counter()
    act()
    wait_idle(page, timeout_ms, after=before)
    return time.perf_counter() - t0


def submit(page, text: str) -> Callable[[], None]:
    def act() -> None:
        box = page.locator('[data-testid="stSidebar"] textarea').first
        box.fill(text)
        box.press("Control+Enter")

    return act


def go(page, name: str) -> Callable[[], None]:
    return lambda: page.locator('[data-testid="stSidebar"]').get_by_role("link", name=name).click()


def pick_head(page, head: int) -> Callable[[], None]:
    def act() -> None:
        page.locator('[data-testid="stSelectbox"]').filter(has_text="Head").first.click()
        page.get_by_role("option", name=f"head {head}", exact=True).click()

    return act


def layer_step(page) -> Callable[[], None]:
    def act() -> None:
        slider = page.get_by_role("slider").first
        slider.focus()
        slider.press("ArrowRight")

    return act


def extractions(log: Callable[[], str]) -> int:
    """How many extractions the server has logged (attnviz.extract logs each one)."""
    return log().count("extract model=")


def fresh(page, act: Callable[[], None], log: Callable[[], str]) -> float:
    """`timed` for a submit that must run the model: a result from the server's cache would time
    a redraw, not a forward, so it stops the bench."""
    before = extractions(log)
    wall = timed(page, act)
    if extractions(log) == before:
        raise RuntimeError("a timed submit ran no forward (a cached text?): the ratio would be wrong")
    return wall


def one_repeat(
    page, lm: attnviz.LoadedModel, n: int, i: int, log: Callable[[], str]
) -> dict[str, tuple[float, float | None]]:
    """{row: (wall seconds, forward seconds or None)} for one pass through the pages."""
    # "Walk": not the submit rows' texts ("Run"), which the server may still hold in its cache
    (text_e, _), (text_o, _) = texts(lm, n, 2 * i + 2, word="Walk")[2 * i :]
    out: dict[str, tuple[float, float | None]] = {}
    parts = urllib.parse.urlsplit(page.url)  # back to the Explorer, whatever page the last pass ended on
    page.goto(f"{parts.scheme}://{parts.netloc}/?model=smollm2-135m")
    wait_idle(page, 600_000)
    wall = fresh(page, submit(page, text_e), log)
    out["Explorer: submit → page idle"] = (wall, forward_median(lm, text_e)[0])
    out["head change → idle"] = (timed(page, pick_head(page, 3 + i)), None)
    out["layer change → idle"] = (timed(page, layer_step(page)), None)
    out["Model overview on the Explorer's cached result → idle"] = (
        timed(page, go(page, "Model overview")),
        None,
    )
    out["page switch back to the Explorer (computed) → idle"] = (timed(page, go(page, "Explorer")), None)
    timed(page, go(page, "Model overview"))
    wall = fresh(page, submit(page, text_o), log)
    out["Model overview: submit a new text → idle"] = (wall, forward_median(lm, text_o)[0])
    wall = timed(page, go(page, "Generation"))
    out["Generation (8 tokens) of that prompt → idle"] = (wall, forward_median(lm, text_o)[0])
    return out


TARGETS = {
    "Explorer: submit → page idle": "≤ 1.5x",
    "head change → idle": "≤ 1 s",
    "layer change → idle": "≤ 1 s",
    "page switch back to the Explorer (computed) → idle": "≤ 1.5 s",
    "Model overview: submit a new text → idle": "≤ 2x",
    "Generation (8 tokens) of that prompt → idle": "≤ 2x",
}


def run_pages(
    page,
    lm: attnviz.LoadedModel,
    n: int,
    repeats: int,
    out: Path,
    no_write: bool,
    version: str,
    log: Callable[[], str],
) -> None:
    """The walk above ``repeats`` times at ``n`` tokens; ``log`` reads the server's log so far."""
    rows: dict[str, list[tuple[float, float | None]]] = {}
    loads = [os.getloadavg()[0]]
    for i in range(repeats):
        for name, value in one_repeat(page, lm, n, i, log).items():
            rows.setdefault(name, []).append(value)
            wall, fwd = value
            extra = f" (forward {fwd:.2f} s, {wall / fwd:.2f}x)" if fwd else ""
            sys.stderr.write(f"  {name}: {wall:.2f} s{extra}\n")
        loads.append(os.getloadavg()[0])
    load = f"{min(loads):.1f}–{max(loads):.1f}"
    lines = []
    sys.stdout.write(HEADER + "\n")
    for name, values in rows.items():
        wall = statistics.median(v[0] for v in values)
        fwds = [v[1] for v in values if v[1]]
        fwd = f"{statistics.median(fwds):.2f} s" if fwds else "—"
        ratio = f"{statistics.median(v[0] / v[1] for v in values if v[1]):.2f}x" if fwds else "—"
        line = f"| {name} ({n}) | {wall:.2f} s | {fwd} | {ratio} | {TARGETS.get(name, '—')} | {load} |"
        sys.stdout.write(line + "\n")
        lines.append(line)
    sys.stdout.flush()
    if not no_write:
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        replace_section(
            out,
            "ui-pages",
            f"Measured {stamp} with `python scripts/bench_ui.py --browser` (Chromium {version} against "
            f"`streamlit run app.py`, CPU ({os.cpu_count()} cores, shared), smollm2-135m, medians of "
            f"{repeats} passes).\n\n{HEADER}\n" + "\n".join(lines),
        )
