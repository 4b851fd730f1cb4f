"""`python -m attnviz bench`: what extraction costs, measured in one run on one machine.

For each length N on the built-in smollm2-135m:
  (a) floor  - one plain SDPA forward pass (what any use of the model costs)
  (b) eager  - transformers' eager attention with output_attentions=True (what other tools do)
  (c) fast   - attnviz's fast path up to the first layer's probabilities
and the ratios (c)/(a), (b)/(c), peak-memory (b)/(c). Medians of --repeats runs. On CUDA it also
runs a Llama-3.2-3B-shaped model (random weights) at 8192 tokens, and the statistics rows
(`attnviz.bench.stats`; ``--llama-sizes`` picks that model's lengths on CUDA).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import backend
from ..extract import extract_ids
from ..limits import bytes_per_element, free_bytes
from ..loading import LoadedModel, load_model, resolve_device
from ..result import PathName
from .common import floor, ids_of_length, llama3b_shaped, machine_line, measure, replace_section

log = logging.getLogger(__name__)
LLAMA_AT = 8192  # CUDA: the Llama-3.2-3B-shaped model's row of this table


def _first_layer(lm: LoadedModel, ids: list[int], path: PathName) -> Callable[[], object]:
    def run() -> object:
        return extract_ids(lm, ids, path=path, max_tokens=len(ids)).layer(0)

    return run


def _eager_bytes(lm: LoadedModel, n: int) -> int:
    lay = lm.layout
    elem = bytes_per_element(lm.dtype)
    return (lay.n_layers + 3) * lay.n_heads * n * n * max(elem, 4)


@dataclass
class Row:
    model: str
    n: int
    floor_s: float
    floor_mem: int
    fast_s: float
    fast_mem: int
    eager_s: float | None
    eager_mem: int | None
    eager_note: str


def _eager_fits(lm: LoadedModel, n: int) -> tuple[bool, str]:
    need, free = _eager_bytes(lm, n), free_bytes(lm.device)
    if need > 0.6 * free:
        return False, f"skipped: needs ~{need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free"
    return True, ""


def cpu_peaks(lm: LoadedModel, sizes: list[int]) -> dict[int, dict[str, int]]:
    """Peak extra memory of one run of each method (run under a fixed mmap threshold)."""
    peaks: dict[int, dict[str, int]] = {}
    floor(lm, ids_of_length(lm, 32))()  # one-time allocations are not part of any peak
    for n in sizes:
        ids = ids_of_length(lm, n)
        got = {
            "floor": measure(floor(lm, ids), lm.device, 1)[1],
            "fast": measure(_first_layer(lm, ids, "fast"), lm.device, 1)[1],
        }
        if _eager_fits(lm, n)[0]:
            got["eager"] = measure(_first_layer(lm, ids, "eager"), lm.device, 1)[1]
        peaks[n] = got
    return peaks


def _cpu_peaks_in_child(sizes: list[int]) -> dict[int, dict[str, int]]:
    """Peaks measured in a child process whose glibc returns freed tensors to the OS at once
    (MALLOC_MMAP_THRESHOLD_), so the kernel's high-water mark sees each run's own peak. Times
    are measured here, with the allocator people actually run."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "1048576"}
    cmd = [sys.executable, "-m", "attnviz", "bench", "--peaks-only", "--device", "cpu",
           "--sizes", ",".join(map(str, sizes))]  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def bench_model(
    lm: LoadedModel, sizes: list[int], repeats: int, peaks: dict[int, dict[str, int]] | None = None
) -> list[Row]:
    """Median times of each method at each N; peaks from ``peaks`` (CPU) or measured (CUDA)."""
    rows = []
    device = lm.device
    for n in sizes:
        ids = ids_of_length(lm, n)
        floor(lm, ids[:32])()  # warm-up
        floor_s, floor_mem = measure(floor(lm, ids), device, repeats)
        fast_s, fast_mem = measure(_first_layer(lm, ids, "fast"), device, repeats)
        eager_s = eager_mem = None
        fits, note = _eager_fits(lm, n)
        if fits:
            try:
                eager_s, eager_mem = measure(_first_layer(lm, ids, "eager"), device, max(1, repeats - 1))
            except Exception as err:  # noqa: BLE001 - report, keep benchmarking
                note = f"failed: {type(err).__name__}"
        if peaks is not None:
            floor_mem, fast_mem = peaks[n]["floor"], peaks[n]["fast"]
            eager_mem = peaks[n].get("eager") if eager_s is not None else None
        row = Row(lm.spec, n, floor_s, floor_mem, fast_s, fast_mem, eager_s, eager_mem, note)
        sys.stdout.write(_line(row) + "\n")
        sys.stdout.flush()
        rows.append(row)
    return rows


def _gib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**30:.2f}"


def _line(r: Row) -> str:
    eager = f"{r.eager_s:.2f} s / {_gib(r.eager_mem)} GiB" if r.eager_s is not None else r.eager_note
    speed = f"{r.eager_s / r.fast_s:.1f}x" if r.eager_s else "-"
    mem = f"{r.eager_mem / max(r.fast_mem, 1):.0f}x" if r.eager_mem else "-"
    return (
        f"| {r.model} | {r.n} | {r.floor_s:.2f} s / {_gib(r.floor_mem)} GiB | {eager} | "
        f"{r.fast_s:.2f} s / {_gib(r.fast_mem)} GiB | {r.fast_s / r.floor_s:.2f} | {speed} | {mem} |"
    )


HEADER = (
    "| model | N | (a) SDPA forward: time / peak | (b) eager output_attentions | "
    "(c) attnviz fast, to layer 0 | (c)/(a) | (b)/(c) time | (b)/(c) peak memory |\n"
    "|---|---|---|---|---|---|---|---|"
)


def run_bench(args) -> int:
    sizes = [int(s) for s in str(args.sizes).split(",") if s.strip()]
    device = resolve_device(args.device)
    lm = load_model("smollm2-135m", device=str(device))
    if args.peaks_only:
        sys.stdout.write(json.dumps(cpu_peaks(lm, sizes)) + "\n")
        return 0
    peaks = None
    if backend.kind(device) == "cpu":
        sys.stdout.write("measuring peak memory in a child process...\n")
        sys.stdout.flush()
        peaks = _cpu_peaks_in_child(sizes)
    sys.stdout.write(f"machine: {machine_line(device)}\n{HEADER}\n")
    rows = bench_model(lm, sizes, args.repeats, peaks)
    del lm  # before the next model (and before the statistics bench loads its own)
    gc.collect()
    if backend.on_cuda(device):
        backend.backend().empty_cache()
        rows += bench_model(llama3b_shaped(device), [LLAMA_AT], max(1, args.repeats))
    if not args.no_write:
        write_markdown(args.out, rows, machine_line(device), sizes)
        readme = args.out.parent.parent / "README.md"
        if readme.exists() and "<!-- bench:start -->" in readme.read_text():
            write_markdown(readme, rows, machine_line(device), sizes)  # the README quotes the same table
        sys.stdout.write(f"wrote {args.out}\n")
    if getattr(args, "no_stats", False):
        return 0
    from .stats import CUDA_SIZES, run_stats_bench  # whole-model answers: statistics, rollout, pooled view

    chosen = getattr(args, "stats_sizes", None)
    stats_sizes = [int(s) for s in str(chosen).split(",") if s.strip()] if chosen else sizes
    llama = getattr(args, "llama_sizes", None)
    llama_sizes = [int(s) for s in str(llama).split(",") if s.strip()] if llama else CUDA_SIZES
    return run_stats_bench(
        args.device, stats_sizes, args.repeats, None if args.no_write else args.out, llama_sizes=llama_sizes
    )


def write_markdown(path: Path, rows: list[Row], machine: str, sizes: list[int]) -> None:
    """Replace the measured section of docs/benchmarks.md."""
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    table = "\n".join(_line(r) for r in rows)
    replace_section(
        path,
        "bench",
        f"Measured {stamp} on {machine}; `python -m attnviz bench --sizes "
        f"{','.join(map(str, sizes))}`. Times: medians, default allocator. Peak = memory above the "
        f"loaded model (CPU: resident-set high-water mark of one run in a child process with a fixed "
        f"mmap threshold; CUDA: max_memory_allocated).\n\n{HEADER}\n{table}",
    )
