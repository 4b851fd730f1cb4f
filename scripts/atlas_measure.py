"""The numbers of README "Atlas over a big corpus": texts/s of the local engine and of Ray with 1 and 2
workers, Ray's overhead on a 20-text corpus, and the driver's cost per entry (what caps N workers).

    python scripts/atlas_measure.py [--model smollm2-135m] [--texts 40] [--repeats 3]

Each engine runs the same texts of the built-in corpus with a fresh disk cache (every text is
computed and written). Runs are interleaved (local, ray x1, ray x2, local, ...) and the medians
are printed: wall time end to end (model load and Ray start included), time to the first text,
and the steady rate (texts after the first / time after the first). Torch threads: 2 for the
local engine and a 1-worker Ray; 1 per worker for 2 workers (attnviz.atlas.ray_engine.RaySession.plan).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def one_run(model: str, texts: list[str], engine: str, workers: int | None, cache: str) -> dict[str, float]:
    from attnviz.atlas import run_atlas

    marks: list[tuple[int, float]] = []
    t0 = time.perf_counter()

    def progress(done: int, total: int, note: str) -> None:
        marks.append((done, time.perf_counter()))

    at = run_atlas(model, texts, engine=engine, workers=workers, cache_root=cache, progress=progress)
    wall = time.perf_counter() - t0
    assert at.computed == len(texts) and at.n_texts == len(texts), (at.computed, at.skipped)
    first = next(t for d, t in marks if d >= 1)
    rate = (len(texts) - 1) / (marks[-1][1] - first)
    return {"wall": wall, "first": first - t0, "rate": rate}


def driver_cost(layers: int, heads: int, n: int = 200) -> tuple[float, int]:
    """Seconds per entry on the driver (decode the worker's bytes, checksum, atomic write with
    fsync) for a model of ``layers`` x ``heads``, and the entry's size."""
    from attnviz.atlas.cache import AtlasCache, Entry, decode, encode

    rng = np.random.default_rng(0)
    tokens = tuple(f"tok{i}" for i in range(512))
    with tempfile.TemporaryDirectory() as folder:
        store = AtlasCache(Path(folder))
        blobs = [
            encode(Entry(f"{i:032x}", tokens, rng.random((5, layers, heads)), rng.random((layers, heads, 3))))
            for i in range(n)
        ]
        t0 = time.perf_counter()
        for i, blob in enumerate(blobs):
            store.put(decode(blob, f"{i:032x}"))
        return (time.perf_counter() - t0) / n, len(blobs[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--texts", type=int, default=40)
    ap.add_argument("--overhead-texts", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from attnviz.atlas import builtin_corpus

    corpus = builtin_corpus()
    configs = [("local", None), ("ray", 1), ("ray", 2)]
    for n in (args.texts, args.overhead_texts):
        texts = corpus[:n]
        runs: dict[str, list[dict[str, float]]] = {}
        for _ in range(args.repeats):
            for engine, workers in configs:
                with tempfile.TemporaryDirectory() as cache:  # every text computed and written
                    name = f"{engine} x{workers or 1}"
                    runs.setdefault(name, []).append(one_run(args.model, texts, engine, workers, cache))
        print(f"\n{args.model}, {n} texts, medians of {args.repeats} (load average {os.getloadavg()[0]:.1f})")
        for name, rs in runs.items():
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            print(
                f"  {name:9s} wall {med['wall']:6.1f} s  first text {med['first']:5.1f} s  "
                f"steady {med['rate']:5.2f} texts/s"
            )
    for layers, heads, label in ((30, 9, "smollm2-135m"), (32, 32, "8B-like"), (80, 64, "70B-like")):
        sec, size = driver_cost(layers, heads)
        print(
            f"driver per entry, {label} ({layers}x{heads}): {sec * 1e3:.2f} ms, {size / 1e3:.0f} KB "
            f"-> at most {1 / sec:.0f} texts/s"
        )


if __name__ == "__main__":
    main()
