"""`make gpu-check`'s benchmark: the Llama-3.2-3B-shaped random bf16 model on one CUDA GPU.

Per length N (1k, 8k, 32k and, when memory and time allow, 128k), each a median of a few runs
and a ratio to the floor measured in the same run on the same ids:

- floor       one plain SDPA forward (`common.floor`)
- first head  extract + one head of layer 0 as the explorer shows it first (whole up to
              HEAD_SIDE tokens, pooled to HEAD_SIDE bins beyond: a dense 128k head is 64 GiB)
- statistics  extract + every head's statistics (`head_metrics`: the second fused pass per layer)
- rollout     a fresh extract, then the rollout of the last token (`token_rollout`, its LSE
              passes included); its ratio is the rollout alone
- head view   (at ``view_at`` tokens) one head pooled to the page's bins (`pooled`, L known)
              and drawn as the page's figure (`figures.head_heatmap`), server side

with the peak memory of each above the loaded model (``max_memory_allocated``), the path every
layer took (anything but "fused" is a failure: no fallback anywhere), the kernel layout for head
dim 128 (V split into register-file calls vs one general call, `fused.SPLIT_VALUES`) and the
bf16 drift per layer (`drift.measure` on 1k tokens). `markdown` renders the report with the
targets of issue 20 marked met or not.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .. import backend
from ..analysis.pooling import equal_edges, pooled
from ..analysis.rollout import token_rollout
from ..exact import fused
from ..extract import FAST_METHOD, extract_ids
from ..figures import SINGLE_MAX_CELLS, bin_labels, head_heatmap
from ..limits import token_budget
from ..loading import LoadedModel
from ..metrics import head_metrics
from . import drift
from .common import cuda_run, floor, ids_of_length, machine_line

SIZES = (1024, 8192, 32768, 131072)
VIEW_AT = 32768
HEAD_SIDE = int(SINGLE_MAX_CELLS**0.5)  # the long-view page's bins per axis of one head


@dataclass
class Timed:
    seconds: float
    peak: int  # bytes above the loaded model


@dataclass
class Row:
    n: int
    floor: Timed
    first: Timed
    stats: Timed
    rollout: Timed
    view: Timed | None = None
    problems: list[str] = field(default_factory=list)  # paths that were not fused


@dataclass
class GpuReport:
    machine: str
    date: str
    rows: list[Row] = field(default_factory=list)
    drift: list[drift.LayerDrift] = field(default_factory=list)
    layout: dict[str, float] = field(default_factory=dict)  # statistics seconds by V layout
    skipped: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    tests: str = ""  # the GPU suite's summary line (filled by scripts/gpu_check.py)


def timed(fn: Callable[[], Any], device, repeats: int) -> tuple[Timed, Any]:
    """(median seconds and the largest peak over ``repeats`` runs of `common.cuda_run`, the last
    run's output; the previous output is dropped before each run)."""
    times, peaks, out = [], [], None
    for _ in range(max(1, repeats)):
        out = None
        seconds, peak, out = cuda_run(fn, device)
        times.append(seconds)
        peaks.append(peak)
    return Timed(statistics.median(times), max(peaks)), out


def _unfused(what: str, paths) -> list[str]:
    return [f"{what} layer {i}: {p}" for i, p in enumerate(paths) if p != "fused"]


def row(lm: LoadedModel, n: int, repeats: int, view: bool) -> Row:
    """One length's measurements (see the module docstring)."""
    dev = lm.device
    ids = ids_of_length(lm, n)
    floor(lm, ids[:32])()  # warm-up
    t_floor, _ = timed(floor(lm, ids), dev, repeats)

    def first() -> Any:  # as the explorer shows it: the whole head, or pooled past HEAD_SIDE tokens
        res = extract_ids(lm, ids, max_tokens=n)
        if n <= HEAD_SIDE:
            return res, res.layer_tensor(0, heads=[0])
        edges = equal_edges(n, HEAD_SIDE)
        return res, pooled(res, 0, [0], row_edges=edges, col_edges=edges, pools=["max"])

    t_first, (res, _) = timed(first, dev, repeats)
    problems = [] if res.method == FAST_METHOD else [f"extract: {res.method}"]
    t_stats, hm = timed(lambda: head_metrics(extract_ids(lm, ids, max_tokens=n)), dev, repeats)
    problems += _unfused("statistics", hm.paths)
    del res, hm
    rolls = []
    for _ in range(max(1, repeats)):
        fresh = extract_ids(lm, ids, max_tokens=n)
        t, roll = timed(partial(token_rollout, fresh), dev, 1)
        rolls.append(t)
        del fresh
    t_roll = Timed(statistics.median(t.seconds for t in rolls), max(t.peak for t in rolls))
    problems += _unfused("rollout", roll.paths)
    out = Row(n, t_floor, t_first, t_stats, t_roll, problems=problems)
    if view:
        res = extract_ids(lm, ids, max_tokens=n)
        layer, head = res.n_layers() // 2, 0
        edges = equal_edges(n, HEAD_SIDE)
        labels = bin_labels([str(i) for i in range(n)], edges)
        pooled(res, layer, [head], row_edges=edges, col_edges=edges, pools=["max"])  # L known, as on the page

        def draw() -> Any:
            pv = pooled(res, layer, [head], row_edges=edges, col_edges=edges, pools=["max"])
            return pv, head_heatmap(pv.values("max")[0], labels, labels, max_cells=SINGLE_MAX_CELLS)

        out.view, (pv, _) = timed(draw, dev, repeats)
        if pv.path != "fused":
            problems.append(f"head view: {pv.path}")
        del res
    return out


def kernel_layout(lm: LoadedModel, n: int) -> dict[str, float]:
    """Statistics seconds at ``n`` tokens with V split into register-file calls and in one call."""
    res = extract_ids(lm, list(ids_of_length(lm, n)), max_tokens=n)
    got = {}
    for split in (True, False):
        fused.SPLIT_VALUES = split
        try:
            got["split (rf kernels)" if split else "one call (general kernel)"] = timed(
                lambda: head_metrics(res), lm.device, 1
            )[0].seconds
        finally:
            fused.SPLIT_VALUES = True
    return got


def run(
    lm: LoadedModel,
    sizes: tuple[int, ...] = SIZES,
    *,
    repeats: int = 3,
    view_at: int = VIEW_AT,
    budget_s: float = 420.0,
    drift_tokens: int = 1024,
    layout_at: int = 8192,
) -> GpuReport:
    """Every row that fits the device's memory and the time budget, the layout and drift rows."""
    t0 = time.perf_counter()
    report = GpuReport(machine_line(lm.device), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    for n in sizes:
        spent = time.perf_counter() - t0
        if n > token_budget(lm.layout, lm.device, lm.dtype):
            report.skipped.append(f"{n} tokens: more than this device's memory holds")
            continue
        if report.rows and spent > budget_s / 2 and n > max(r.n for r in report.rows):
            report.skipped.append(f"{n} tokens: {spent:.0f} s spent of the {budget_s:.0f} s budget")
            continue
        try:
            reps = repeats if n <= 8192 else max(1, repeats - 1) if n <= 32768 else 1
            got = row(lm, n, reps, n == view_at)
        except Exception as err:  # noqa: BLE001 - one failed row is a failure in the report, not a crash
            report.failures.append(f"{n} tokens: {type(err).__name__}: {err}")
            continue
        report.rows.append(got)
        report.failures += [f"{n} tokens: {p}" for p in got.problems]
        backend.backend().empty_cache()
    try:
        if layout_at and layout_at <= max((r.n for r in report.rows), default=0):
            report.layout = kernel_layout(lm, layout_at)
        report.drift = drift.measure(lm, ids_of_length(lm, min(drift_tokens, max(sizes))))
    except Exception as err:  # noqa: BLE001
        report.failures.append(f"layout / drift: {type(err).__name__}: {err}")
    return report


TARGETS = (
    "extract + statistics ≤ 1.5× the floor from 8k to 32k, ≤ 2× at 128k; rollout ≤ 2× at 8k; "
    "a head view at 32k ≤ 0.2 s; no fallback"
)


def targets(report: GpuReport) -> list[tuple[str, bool]]:
    """Issue 20's targets, each (what, met) for the rows measured."""
    out = []
    for r in report.rows:
        ratio = r.stats.seconds / r.floor.seconds
        if 8192 <= r.n <= 32768:
            out.append((f"statistics {r.n}: {ratio:.2f}× ≤ 1.5×", ratio <= 1.5))
        if r.n >= 131072:
            out.append((f"statistics {r.n}: {ratio:.2f}× ≤ 2×", ratio <= 2.0))
        if r.n == 8192:
            rr = r.rollout.seconds / r.floor.seconds
            out.append((f"rollout {r.n}: {rr:.2f}× ≤ 2×", rr <= 2.0))
        if r.view is not None:
            out.append((f"head view {r.n}: {r.view.seconds:.3f} s ≤ 0.2 s", r.view.seconds <= 0.2))
    out.append(("no fallback path", not any(r.problems for r in report.rows)))
    return out


def _gib(b: int) -> str:
    return f"{b / 2**30:.2f}"


def markdown(report: GpuReport) -> str:
    """The report: rows as ratios to the floor, peaks, layout, drift, targets, failures."""
    lines = [
        f"Measured {report.date} on {report.machine}; `make gpu-check`. Llama-3.2-3B-shaped random "
        "bf16 model (28 layers, 24 heads, 8 KV heads, head dim 128). Medians; ratios to the SDPA "
        "forward (floor) of the same row; peak = max_memory_allocated above the loaded model.",
        "",
        f"GPU suite: {report.tests or 'not run'}",
        "",
        "| N | floor | first head | extract + all-head statistics | rollout of one token | head view | "
        "peak GiB: floor / first / statistics / rollout |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report.rows:
        f = r.floor.seconds
        view = "-" if r.view is None else f"{r.view.seconds:.3f} s"
        lines.append(
            f"| {r.n} | {f:.3f} s | {r.first.seconds / f:.2f}× | {r.stats.seconds / f:.2f}× | "
            f"{r.rollout.seconds / f:.2f}× | {view} | {_gib(r.floor.peak)} / {_gib(r.first.peak)} / "
            f"{_gib(r.stats.peak)} / {_gib(r.rollout.peak)} |"
        )
    if report.layout:
        lines += ["", "Head dim 128, statistics at 8k by value layout: "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in report.layout.items())]  # fmt: skip
    if report.drift:
        lines += ["", "bf16 drift per layer (max |Δp|): " + ", ".join(
            f"{d.layer}: {d.same_input:.1e} / {d.sdpa_vs_eager:.1e}" for d in report.drift
        ) + " (same input / SDPA run vs eager run)"]  # fmt: skip
    lines += ["", f"Targets ({TARGETS}):"]
    lines += [f"- {'met' if ok else 'NOT met'}: {what}" for what, ok in targets(report)]
    lines += [f"- skipped: {s}" for s in report.skipped]
    lines += [f"- FAILURE: {f}" for f in report.failures]
    return "\n".join(lines)
