"""The numbers of README "Atlas over a big corpus": texts/s of the local engine and of Ray with 1 and 2
workers, Ray's overhead on a 20-text corpus, and the driver's cost per entry (what caps N workers).

    python scripts/atlas_measure.py [--model smollm2-135m] [--repeats 3]

Each engine runs the same texts end to end (model load and Ray start included) with a fresh disk
cache, so every text is computed and written; runs are interleaved (local, ray x1, ray x2, local,
...) and medians are taken. Steady rate: the second half of a 132-text corpus (the built-in corpus
twice, the second copy marked so every text is distinct) over the time it took, from the progress
callbacks. Overhead: wall time of a 20-text corpus minus the local engine's. Torch threads: 2 for
the local engine and a 1-worker Ray, 1 per worker for 2 workers (RaySession.plan).
OMP_WAIT_POLICY=PASSIVE unless set: on a CPU other processes also use, OpenMP's spin-waiting made 2
threads ~10x slower than 1 here.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts its OpenMP pool

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def one_run(model: str, texts: list[str], engine: str, workers: int | None, cache: str) -> dict[str, float]:
    from attnviz.atlas import run_atlas

    marks: dict[int, float] = {}

    def progress(done: int, total: int, note: str) -> None:
        marks.setdefault(done, time.perf_counter())

    t0 = time.perf_counter()
    at = run_atlas(model, texts, engine=engine, workers=workers, cache_root=cache, progress=progress)
    wall = time.perf_counter() - t0
    assert at.computed == len(texts) and at.n_texts == len(texts), (at.computed, at.skipped)
    n, half = len(texts), len(texts) // 2
    return {"wall": wall, "first": marks[1] - t0, "rate": (n - half) / (marks[n] - marks[half])}


def driver_cost(layers: int, heads: int, n: int = 200) -> tuple[float, float, int]:
    """Seconds per entry on the driver for a model of ``layers`` x ``heads``: checking a worker's
    bytes (checksum, shapes) alone, and with the atomic write and fsync; and the entry's size."""
    from attnviz.atlas.cache import AtlasCache, Entry, decode, encode

    rng = np.random.default_rng(0)
    tokens = tuple(f"tok{i}" for i in range(512))
    blobs = [
        encode(Entry(f"{i:032x}", tokens, rng.random((5, layers, heads)), rng.random((layers, heads, 3))))
        for i in range(n)
    ]
    t0 = time.perf_counter()
    checked = [decode(blob, f"{i:032x}") for i, blob in enumerate(blobs)]
    check = (time.perf_counter() - t0) / n
    with tempfile.TemporaryDirectory() as folder:
        store = AtlasCache(Path(folder))
        t0 = time.perf_counter()
        for entry in checked:
            store.put(entry)
        write = (time.perf_counter() - t0) / n
    return check, check + write, len(blobs[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from attnviz.atlas import builtin_corpus

    corpus = builtin_corpus()
    big = corpus + [f"{t} (again)" for t in corpus]
    configs = (("local", None), ("ray", 1), ("ray", 2))
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    for _ in range(args.repeats):
        for texts in (big, corpus[:20]):
            for engine, workers in configs:
                with tempfile.TemporaryDirectory() as cache:  # every text computed and written
                    got = one_run(args.model, texts, engine, workers, cache)
                runs.setdefault((f"{engine} x{workers or 1}", len(texts)), []).append(got)
    load = os.getloadavg()
    print(
        f"{args.model}, medians of {args.repeats}, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, "
        f"load average {load[0]:.1f} / {load[2]:.1f} (1 / 15 min)"
    )

    def med(name: str, n: int, key: str) -> float:
        return statistics.median(r[key] for r in runs[(name, n)])

    for name in ("local x1", "ray x1", "ray x2"):
        over = med(name, 20, "wall") - med("local x1", 20, "wall")
        print(
            f"  {name:8s} steady {med(name, len(big), 'rate'):5.2f} texts/s ({len(big)} texts: wall "
            f"{med(name, len(big), 'wall'):5.1f} s, first text after {med(name, len(big), 'first'):4.1f} s); "
            f"20 texts: wall {med(name, 20, 'wall'):5.1f} s (+{over:4.1f} s over local)"
        )
    for layers, heads, label in ((30, 9, "smollm2-135m"), (32, 32, "8B-like"), (80, 64, "70B-like")):
        check, total, size = driver_cost(layers, heads)
        print(
            f"driver per entry, {label} ({layers}x{heads}, 512 tokens): {size / 1e3:.0f} KB, check "
            f"{check * 1e3:.2f} ms, check + write + fsync {total * 1e3:.2f} ms "
            f"-> at most {1 / total:.0f} texts/s"
        )


if __name__ == "__main__":
    main()
