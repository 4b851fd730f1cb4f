"""QK attribution benchmark: one cell and one query row, against one plain SDPA forward.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_qk.py [--sizes 1024,8192] [--repeats 3]

On the built-in smollm2-135m (30 layers x 9 heads), for each length N (random token ids, seed 0),
in one process and interleaved repeat by repeat: the floor (one plain SDPA forward, logits at the
last position), the trace (`attnviz.explain.trace`, the forward every explanation reads), one cell
(`qk_attribution` of layer 29 head 3, the last query and the middle key, from the trace: 301
parts a side) and one query row (`qk_row` of the same head and query over every key, from the
trace). Prints one markdown row per N (wall seconds and the ratio to the floor; medians).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_explain import floor
from bench_explain import timed as wall_and_cpu

import attnviz
from attnviz.explain import qk_attribution, qk_row, trace

LAYER, HEAD = 29, 3


def timed(fn) -> tuple[tuple[float, float], object]:
    """((wall s, process CPU s), result): the CPU time moves less with other sessions' load."""
    wall, cpu, out = wall_and_cpu(fn)
    return (wall, cpu), out


def one_repeat(lm, ids: list[int], n: int) -> dict[str, tuple[float, float]]:
    spent, tr = timed(lambda: trace(lm, ids, max_tokens=n))
    cell = timed(lambda: qk_attribution(lm, tr, layer=LAYER, head=HEAD, query=-1, key=n // 2))[0]
    row = timed(lambda: qk_row(lm, tr, layer=LAYER, head=HEAD, query=-1))[0]
    return {"trace": spent, "cell": cell, "row": row}


def bench(lm, n: int, repeats: int) -> str:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, lm.tokenizer.vocab_size, (n,), generator=g).tolist()
    floor(lm, ids)  # warm-up
    secs: dict[str, list[tuple[float, float]]] = {}
    for _ in range(repeats):
        secs.setdefault("floor", []).append(timed(lambda: floor(lm, ids))[0])
        for name, spent in one_repeat(lm, ids, n).items():
            secs.setdefault(name, []).append(spent)
        shown = ", ".join(f"{k} {v[-1][0]:.2f} s wall / {v[-1][1]:.2f} s CPU" for k, v in secs.items())
        sys.stdout.write(f"N={n}: {shown}\n")
        sys.stdout.flush()
    wall = {k: statistics.median(x[0] for x in v) for k, v in secs.items()}
    cpu = {k: statistics.median(x[1] for x in v) for k, v in secs.items()}
    cells = [
        f"{wall[k]:.2f} s / {cpu[k]:.2f} s ({wall[k] / wall['floor']:.2f}x / {cpu[k] / cpu['floor']:.2f}x)"
        for k in ("trace", "cell", "row")
    ]
    return f"| {n} | {wall['floor']:.2f} s / {cpu['floor']:.2f} s | " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,8192")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    start = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    lm = attnviz.load_model("smollm2-135m", device="cpu")
    rows = [bench(lm, int(n), args.repeats) for n in args.sizes.split(",")]
    end = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    sys.stdout.write(
        f"\nMeasured {when} on CPU ({os.cpu_count()} shared cores, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}), `uptime` at the start: {start}; at the end: {end}.\n\n"
        "Each cell: wall / process CPU seconds (medians), ratio to the floor in brackets.\n\n"
        "| N | forward (floor) | trace | one cell, from the trace (< 1 s) | one query row, from the trace "
        "(≤ 2x) |\n|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )


if __name__ == "__main__":
    main()
