"""What both halves of the browser UI bench share (scripts/bench_ui_browser.py, the submit rows;
scripts/bench_ui_pages.py, the page costs): the texts they paste and one plain forward of a text."""

from __future__ import annotations

import time

import attnviz
from attnviz.bench.common import floor, ids_of_length
from attnviz.extract import tokenize


def texts(lm: attnviz.LoadedModel, n: int, repeats: int) -> list[tuple[str, int]]:
    """``repeats`` different texts of at most ``n`` tokens as the app counts them (a different
    first words: no cache hit) and those counts."""
    out = []
    for i in range(repeats):
        prefix, cut = f"Run {i + 1}.", 2
        while True:
            text = f"{prefix} {lm.tokenizer.decode(ids_of_length(lm, n - cut))}"
            count = len(tokenize(lm, text)[0])
            if count <= n:
                break
            cut += count - n
        out.append((text, count))
    return out


def forward_once(lm: attnviz.LoadedModel, text: str) -> tuple[float, float]:
    """(wall, CPU) seconds of one plain SDPA forward of ``text`` as the app tokenizes it (no
    capture; CPU = this process, every thread)."""
    run = floor(lm, list(tokenize(lm, text)[0]))
    t0, c0 = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - t0, time.process_time() - c0
