"""What both halves of the browser UI bench share (scripts/bench_ui_browser.py, the submit rows;
scripts/bench_ui_pages.py, the page costs): the texts they paste and one plain forward of a text."""

from __future__ import annotations

import time

import attnviz
from attnviz.bench.common import floor, ids_of_length
from attnviz.inputs import tokenize


def texts(lm: attnviz.LoadedModel, n: int, repeats: int, word: str = "Run") -> list[tuple[str, int]]:
    """``repeats`` different texts of at most ``n`` tokens as the app counts them and those
    counts. Each starts "<word> <i>.": no two texts hit the app's result cache, and a table that
    must not reuse another's results passes its own ``word``."""
    out = []
    for i in range(repeats):
        prefix, cut = f"{word} {i + 1}.", 2
        while True:
            text = f"{prefix} {lm.tokenizer.decode(ids_of_length(lm, n - cut))}"
            count = len(tokenize(lm, text)[0])
            if count <= n:
                break
            cut += count - n
        out.append((text, count))
    return out


def forward_median(lm: attnviz.LoadedModel, text: str, runs: int = 3) -> tuple[float, float]:
    """(wall, CPU) seconds of one plain SDPA forward of ``text`` as the app tokenizes it (no
    capture; CPU = this process, every thread): the median of ``runs`` forwards, so that one
    forward slowed by the server's or the browser's last work (or one lucky one) does not
    set a page's ratio."""
    run = floor(lm, list(tokenize(lm, text)[0]))
    times = []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    return sorted(times)[len(times) // 2]
