"""Whole-model answers in the benchmark: each as a ratio to one plain SDPA forward in the same run.

Rows per length N: (a) one SDPA forward; extract + every head's statistics (`head_metrics`),
once with a plain extract (the statistics take a second fused pass per layer) and once with
``extract(statistics=True)`` (L and the expectations kept by the forward itself); rollout of the
last token (`token_rollout`, on a fresh plain result: its LSE pass included); one pooled view of
a layer (`pooled`, 256 cells, all heads, after the LSE is known). Medians of ``repeats`` runs.
CPU: the built-in smollm2-135m; CUDA: also the Llama-3.2-3B-shaped random bf16 model at
``--llama-sizes`` (default 1k to 128k tokens; there the statistics keep the second pass: the
forward's flash call is widened on the CPU only). ``python -m attnviz.bench.stats --sizes 256,1024,2048`` runs
only these rows; ``python -m attnviz bench`` runs them after its own table.
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import cast

import torch

from .. import backend
from ..analysis.pooling import pooled
from ..analysis.rollout import token_rollout
from ..extract import extract_ids
from ..loading import LoadedModel, load_model, resolve_device
from ..metrics import head_metrics
from ..result import AttentionResult
from .common import floor, ids_of_length, llama3b_shaped, machine_line, replace_section

log = logging.getLogger(__name__)
CUDA_SIZES = [1024, 8192, 32768, 131072]


@dataclass
class StatsRow:
    model: str
    n: int
    forward_s: float
    extract_s: float
    stats_s: float
    extract_fwd_s: float  # extract(statistics=True)
    stats_fwd_s: float  # head_metrics on that result
    rollout_s: float
    pooled_s: float
    fused_layers: str  # layers off the dense path: second pass / from the forward
    stats_cpu_ratio: float = float("nan")  # (extract + statistics) / forward in process CPU time
    stats_fwd_cpu_ratio: float = float("nan")
    rollout_cpu_ratio: float = float("nan")


_CPU: dict[str, list[float]] = {}  # process CPU seconds of the last `_time` calls, by name


def _time(fn: Callable[[], object], device: torch.device, name: str = "") -> tuple[float, object]:
    """Wall seconds of fn() (and its process CPU seconds into ``_CPU[name]``: on a shared CPU
    the CPU-time ratio is the steadier one)."""
    gc.collect()
    backend.synchronize(device)
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    backend.synchronize(device)
    wall = time.perf_counter() - t0
    if name:
        _CPU.setdefault(name, []).append(time.process_time() - c0)
    return wall, out


def _off_dense(hm) -> str:
    return f"{sum(not p.startswith('dense') for p in hm.paths)}/{len(hm.paths)}"


def stats_rows(lm: LoadedModel, sizes: list[int], repeats: int) -> list[StatsRow]:
    """Median seconds of each answer at each N (ratios are taken against the same run's forward)."""
    rows = []
    dev = lm.device
    names = ("forward", "extract", "stats", "extract_fwd", "stats_fwd", "rollout", "pooled")
    for n in sizes:
        ids = ids_of_length(lm, n)
        floor(lm, ids[:32])()  # warm-up
        _CPU.clear()
        got: dict[str, list[float]] = {k: [] for k in names}
        paths = ["", ""]
        for _ in range(max(1, repeats)):
            got["forward"].append(_time(floor(lm, ids), dev, "forward")[0])
            t, out = _time(partial(extract_ids, lm, ids, max_tokens=n), dev, "extract")
            res = cast(AttentionResult, out)
            got["extract"].append(t)
            # rollout and the pooled view first: `head_metrics` runs its own pass whatever they kept
            got["rollout"].append(_time(partial(token_rollout, res), dev, "rollout")[0])
            got["pooled"].append(_time(partial(pooled, res, res.n_layers() // 2), dev)[0])
            t, hm = _time(partial(head_metrics, res), dev, "stats")
            got["stats"].append(t)
            paths[0] = _off_dense(hm)
            del res, out, hm
            t, out = _time(partial(extract_ids, lm, ids, max_tokens=n, statistics=True), dev, "extract_fwd")
            got["extract_fwd"].append(t)
            t, hm = _time(partial(head_metrics, cast(AttentionResult, out)), dev, "stats_fwd")
            got["stats_fwd"].append(t)
            n_fwd = sum(p.startswith("forward") for p in hm.paths)  # type: ignore[attr-defined]
            paths[1] = f"{n_fwd}/{len(hm.paths)}"  # type: ignore[attr-defined]
            del out, hm
        med = {k: statistics.median(v) for k, v in got.items()}
        cpu = {k: statistics.median(v) for k, v in _CPU.items()}
        row = StatsRow(
            lm.spec, n, med["forward"], med["extract"], med["stats"], med["extract_fwd"], med["stats_fwd"],
            med["rollout"], med["pooled"], " / ".join(paths),
            (cpu["extract"] + cpu["stats"]) / cpu["forward"],
            (cpu["extract_fwd"] + cpu["stats_fwd"]) / cpu["forward"], cpu["rollout"] / cpu["forward"],
        )  # fmt: skip
        sys.stdout.write(_line(row) + "\n")
        sys.stdout.flush()
        rows.append(row)
    return rows


HEADER = (
    "| model | N | (a) SDPA forward | extract + all-head statistics (second pass) | ratio to (a) | "
    "extract(statistics=True) + statistics (from the forward) | ratio | "
    "rollout of the last token | ratio | pooled view (256 cells, all heads) | ratio | "
    "fast layers: second pass / from the forward | "
    "CPU-time ratios: second pass / from the forward / rollout |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def _line(r: StatsRow) -> str:
    f = r.forward_s
    return (
        f"| {r.model} | {r.n} | {f:.2f} s | {r.extract_s:.2f} + {r.stats_s:.2f} s | "
        f"{(r.extract_s + r.stats_s) / f:.2f} | {r.extract_fwd_s:.2f} + {r.stats_fwd_s:.2f} s | "
        f"{(r.extract_fwd_s + r.stats_fwd_s) / f:.2f} | {r.rollout_s:.2f} s | {r.rollout_s / f:.2f} | "
        f"{r.pooled_s:.2f} s | {r.pooled_s / f:.2f} | {r.fused_layers} | "
        f"{r.stats_cpu_ratio:.2f} / {r.stats_fwd_cpu_ratio:.2f} / {r.rollout_cpu_ratio:.2f} |"
    )


def write_stats_section(path: Path, rows: list[StatsRow], machine: str, sizes: list[int], note: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    table = "\n".join(_line(r) for r in rows)
    replace_section(
        path,
        "stats",
        f"Measured {stamp} on {machine}; `python -m attnviz.bench.stats --sizes "
        f"{','.join(map(str, sizes))}`. Medians; every ratio is to the SDPA forward (a) of the same "
        f"row. {note}\n\n{HEADER}\n{table}",
    )


def run_stats_bench(
    device_name: str,
    sizes: list[int],
    repeats: int,
    out: Path | None,
    note: str = "",
    llama_sizes: list[int] = CUDA_SIZES,
) -> int:
    device = resolve_device(device_name)
    lm = load_model("smollm2-135m", device=str(device))
    machine = machine_line(device)
    sys.stdout.write(f"machine: {machine}\n{HEADER}\n")
    rows = stats_rows(lm, sizes, repeats)
    del lm
    gc.collect()
    if backend.on_cuda(device) and llama_sizes:  # the Llama-3.2-3B-shaped rows: CUDA only
        backend.backend().empty_cache()
        rows += stats_rows(llama3b_shaped(device), llama_sizes, max(1, repeats))
    if out is not None:
        write_stats_section(out, rows, machine, sizes, note)
        sys.stdout.write(f"wrote {out}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnviz.bench.stats", description=__doc__)
    parser.add_argument("--sizes", default="256,1024,2048")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--note", default="")
    parser.add_argument(
        "--llama-sizes", default=",".join(map(str, CUDA_SIZES)),
        help="CUDA: token counts of the Llama-3.2-3B-shaped rows ('' for none)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        llama = [int(s) for s in args.llama_sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes / --llama-sizes must be comma-separated token counts, not {args.sizes!r}")
    if not sizes or min(sizes + llama) < 2 or args.repeats < 1:
        parser.error("--sizes must be token counts >= 2 and --repeats >= 1")
    out = None if args.no_write else args.out
    return run_stats_bench(args.device, sizes, args.repeats, out, args.note, llama_sizes=llama)


if __name__ == "__main__":
    sys.exit(main())
