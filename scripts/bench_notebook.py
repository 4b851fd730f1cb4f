"""Notebook benchmark: what a result's own cell display costs on a long text.

    .venv/bin/python scripts/bench_notebook.py [--tokens 1171] [--repeats 3] [--no-write]

Loads the built-in smollm2-135m on the CPU, extracts a text of exactly ``--tokens`` tokens (the
built-in corpus, attnviz/data/corpus.txt, repeated), then builds the cell display
(`attnviz.figures.notebook.mimebundle`, what Jupyter shows for ``res`` at the end of a cell)
``--repeats`` times. Reports the display's size (every MIME entry, as the notebook stores it),
its median time, which layers it shows, and the extraction time for scale. Results go into
docs/benchmarks.md between the notebook markers (and are printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import attnviz  # noqa: E402
from attnviz.bench.common import machine_line, replace_section  # noqa: E402
from attnviz.figures import notebook  # noqa: E402


def corpus_ids(lm: attnviz.LoadedModel, n: int) -> list[int]:
    """Exactly n token ids of the built-in corpus's sentences, repeated."""
    lines = (ROOT / "attnviz" / "data" / "corpus.txt").read_text().splitlines()
    text = " ".join(line.replace("\\n", "\n") for line in lines if line and not line.startswith("#"))
    ids = lm.tokenizer(text)["input_ids"]
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1171)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    lm = attnviz.load_model("smollm2-135m", device="cpu")
    ids = corpus_ids(lm, args.tokens)
    t0 = time.perf_counter()
    res = attnviz.extract_ids(lm, ids, max_tokens=len(ids))
    extract_s = time.perf_counter() - t0
    times, size = [], 0
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        bundle = notebook.mimebundle(res)  # what `res._repr_mimebundle_()` returns
        times.append(time.perf_counter() - t0)
        size = sum(len(v if isinstance(v, str) else json.dumps(v)) for v in bundle.values())
    cells = res.n_layers() * res.n_heads * len(ids) ** 2
    shown = (
        f"every layer ({res.n_layers()}, slider)"
        if cells <= notebook.REPR_ALL_LAYERS_CELLS
        else f"the middle layer (layer {res.n_layers() // 2}; head_view(res) draws the slider)"
    )
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = (
        f"Measured {when} with `python scripts/bench_notebook.py --tokens {args.tokens}` on "
        f"{machine_line(torch.device('cpu'))}: smollm2-135m, {len(ids)} tokens of the built-in corpus. "
        f"The cell display of `res` (summary + head view) is "
        f"**{size / 1e6:.1f} MB** and takes **{statistics.median(times):.1f} s** (median of "
        f"{args.repeats}), showing {shown}; the extraction before it took {extract_s:.1f} s. "
        f"1-minute load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after."
    )
    print(body)
    if not args.no_write:
        replace_section(ROOT / "docs" / "benchmarks.md", "notebook", body)


if __name__ == "__main__":
    main()
