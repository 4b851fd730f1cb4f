"""Explain benchmark: what routes, the logit lens, attribution and ablation cost, against one forward.

    .venv/bin/python scripts/bench_explain.py [--sizes 2048,8192] [--repeats 3] [--no-write]

On the built-in smollm2-135m (30 layers × 9 heads), for each length N, in one process and
interleaved repeat by repeat (so the shared machine's load falls on all of them alike):
  floor   - one plain SDPA forward pass (logits at the last position), the unit of every ratio;
  trace   - attnviz.explain.trace: the forward with the capture and the block hooks (the
            residual stream around every block; what every explanation reads);
  routes  - information_flow to the last token at the default threshold 0.04, from the trace;
            "routes total" = trace + routes (what `information_flow(lm, text)` costs);
  lens    - logit_lens of the last 16 positions, k = 5, from the trace;
  DLA     - logit_attribution of the last token's prediction, from the trace;
  ablation - ablate_heads of one head (zero), from the trace (one forward with the head replaced).
Ratios are medians of the per-repeat ratios, in wall time and in process CPU time (the CPU ratio
moves less with other people's load). Results go into docs/benchmarks.md between the explain markers.

    .venv/bin/python scripts/bench_explain.py --patching [--sizes 128,512] [--grid-max 512]

Activation patching (issue 33), per N, against the median of three plain forwards of the same ids:
the full head grid by real patching (attnviz.patch, over="heads": layers × heads forwards,
batched; only up to --grid-max tokens), attribution patching of every head × position (two
forwards, one backward; an estimate), and the real patches of its top 20 cells; the estimate's
rank agreement (Spearman) with the real head grid and its worst cell. Rows go between the
patching markers.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import attnviz  # noqa: E402
from attnviz.explain import ablate_heads, information_flow, logit_attribution, logit_lens, trace  # noqa: E402
from attnviz.loading.forward import forward_kwargs  # noqa: E402

WORDS = ["the", "bank", "river", "money", "water", "loan", "fish", "stream", "account", "shore", "deposit"]
COLUMNS = ("trace", "routes", "routes total", "lens", "dla", "ablation")
START, END = "<!-- explain:start -->", "<!-- explain:end -->"


def ids_of_length(lm, n: int) -> list[int]:
    words = (WORDS * (n // len(WORDS) + 2))[: n + 8]
    ids = lm.tokenizer(" ".join(words))["input_ids"]
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def floor(lm, ids: list[int]) -> None:
    """One plain forward with transformers' SDPA attention, logits at the last position."""
    with lm.lock, torch.inference_mode():
        lm.model.set_attn_implementation("sdpa")
        try:
            lm.model(input_ids=torch.tensor([ids], device=lm.device), **forward_kwargs(lm.model))
        finally:
            lm.model.set_attn_implementation("attnviz")


def timed(fn) -> tuple[float, float, object]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def trace_bytes(tr) -> int:
    tensors = [*tr.stream, *tr.attn_added, *tr.mlp_added]
    tensors += [t for c in tr.captured for t in (c.query, c.key, c.value, c.mask) if t is not None]
    return sum(t.numel() * t.element_size() for t in tensors)


def one_repeat(lm, ids: list[int]) -> tuple[dict[str, tuple[float, float]], dict]:
    """Seconds (wall, CPU) of the floor and of each explanation, and the graph's size."""
    out = {"floor": timed(lambda: floor(lm, ids))[:2]}
    w, c, tr = timed(lambda: trace(lm, ids))
    out["trace"] = (w, c)
    w, c, graph = timed(lambda: information_flow(lm, tr))
    out["routes"] = (w, c)
    out["lens"] = timed(lambda: logit_lens(lm, tr))[:2]
    out["dla"] = timed(lambda: logit_attribution(lm, tr))[:2]
    out["ablation"] = timed(lambda: ablate_heads(lm, tr, [(15, 3)]))[:2]
    out["routes total"] = (out["trace"][0] + out["routes"][0], out["trace"][1] + out["routes"][1])
    info = {"nodes": len(graph.nodes), "edges": len(graph.edges), "expanded": graph.expanded}
    info["trace_gib"] = tr.nbytes / 2**30
    return out, info


def bench(lm, n: int, repeats: int) -> dict:
    ids = ids_of_length(lm, n)
    floor(lm, ids)  # warm-up
    ratios: dict[str, list[tuple[float, float]]] = {}
    floors: list[float] = []
    info: dict = {}
    for _ in range(repeats):
        secs, info = one_repeat(lm, ids)
        base = secs.pop("floor")
        floors.append(base[0])
        for name, (w, c) in secs.items():
            ratios.setdefault(name, []).append((w / base[0], c / max(base[1], 1e-9)))
        shown = ", ".join(f"{k} {v[-1][0]:.2f}x" for k, v in ratios.items())
        print(f"N={n}: floor {base[0]:.2f} s, {shown}", flush=True)
    med = {
        k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in ratios.items()
    }
    return {"n": n, "ratios": med, "floor_s": statistics.median(floors), **info}


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def markdown(rows: list[dict], repeats: int, sizes: list[int], loads: tuple[str, str]) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = (
        f"Measured {when} on CPU: {platform.machine()}, {os.cpu_count()} shared cores, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}; load average (1 / 5 / 15 min) "
        f"{loads[0]} at the start, {loads[1]} at the end; `python scripts/bench_explain.py --sizes "
        f"{','.join(map(str, sizes))} --repeats {repeats}`, smollm2-135m. "
        "Each cell: wall-time ratio to one plain SDPA forward of the same ids measured in the same repeat "
        "(median of the repeats), CPU-time ratio in brackets.\n\n"
        "| N | forward (floor) | trace | routes from a trace | routes total (target ≤ 2) "
        "| logit lens, 16 positions (≤ 0.2) | DLA (≤ 0.2) | one ablation (≈ 1) "
        "| kept graph: nodes / edges / rows expanded | trace size |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        cells = [f"{r['ratios'][k][0]:.2f}x ({r['ratios'][k][1]:.2f}x)" for k in COLUMNS]
        graph = f"{r['nodes']} / {r['edges']} / {r['expanded']}"
        lines.append(
            f"| {r['n']} | {r['floor_s']:.2f} s | {' | '.join(cells)} | {graph} | {r['trace_gib']:.2f} GiB |"
        )
    return head + "\n".join(lines) + "\n"


def write(body: str) -> None:
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text()
    if START in text:
        a, b = text.index(START) + len(START), text.index(END)
        text = text[:a] + "\n" + body + text[b:]
    else:
        text += f"\n## Explain: routes, logit lens, attribution, ablation\n\n{START}\n{body}{END}\n"
    path.write_text(text)


P_START, P_END = "<!-- patching:start -->", "<!-- patching:end -->"
VERIFY = 20


def corrupted(lm, ids: list[int]) -> list[int]:
    """``ids`` with the middle token replaced by another word's token (half the text is then a
    prefix both prompts share, which patching runs once into a KV cache)."""
    out, at = list(ids), len(ids) // 2
    swap = [t for t in lm.tokenizer(" fish shore loan")["input_ids"] if t != out[at]]
    out[at] = swap[0]
    return out


def spearman(a, b) -> float:
    """Rank correlation of two arrays (no ties expected)."""
    import numpy as np

    ra = np.argsort(np.argsort(np.ravel(a))).astype(float)
    rb = np.argsort(np.argsort(np.ravel(b))).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def bench_patching(lm, n: int, grid_max: int) -> dict:
    from attnviz.explain import attribution_patch, patch

    clean = ids_of_length(lm, n)
    corrupt = corrupted(lm, clean)
    floor(lm, clean)  # warm-up
    floors = [timed(lambda: floor(lm, clean))[:2] for _ in range(3)]
    base = (statistics.median(f[0] for f in floors), statistics.median(f[1] for f in floors))
    row: dict = {"n": n, "floor_s": base[0], "load": load()}
    w, c, est = timed(lambda: attribution_patch(lm, clean, corrupt, over="heads_by_position", verify=0))
    row["atp"] = (w / base[0], c / base[1])
    marks: list[tuple[float, float]] = []

    def heard(done: int, _total: int) -> None:
        if done >= 3 and not marks:  # the estimate is done; the real patches of its top cells follow
            marks.append((time.perf_counter(), time.process_time()))

    _, _, ver = timed(
        lambda: attribution_patch(lm, clean, corrupt, over="heads_by_position", verify=VERIFY, progress=heard)
    )
    end = (time.perf_counter(), time.process_time())
    row["verify"] = ((end[0] - marks[0][0]) / base[0], (end[1] - marks[0][1]) / base[1])  # top-20 alone
    diffs = [abs(e - r) for e, r in ver.verified.values()]
    row["top_worst"] = max(diffs)
    print(
        f"N={n}: floor {base[0]:.3f} s, AtP {row['atp'][0]:.2f}x, top-{VERIFY} {row['verify'][0]:.2f}x",
        flush=True,
    )
    if n <= grid_max:
        w, c, real = timed(lambda: patch(lm, clean, corrupt, over="heads"))
        row["grid"] = (w / base[0], c / base[1])
        heads_est = est.values.sum(-1)  # denoising: a head's estimate is the sum over its positions
        row["spearman"] = spearman(heads_est, real.values)
        gap = abs(heads_est - real.values)
        at = divmod(int(gap.argmax()), gap.shape[1])
        row["worst"] = (at, float(heads_est[at]), float(real.values[at]))
        print(
            f"N={n}: real grid {row['grid'][0]:.1f}x, Spearman {row['spearman']:.3f}, worst {row['worst']}",
            flush=True,
        )
    row["metric"] = (est.answer_token, est.wrong_token, est.clean_diff, est.corrupted_diff)
    return row


def patching_markdown(rows: list[dict], loads: tuple[str, str]) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = (
        f"Measured {when} on CPU: {platform.machine()}, {os.cpu_count()} cores (a shared machine: "
        f"the load average says how busy), {torch.get_num_threads()} thread(s), torch "
        f"{torch.__version__}, smollm2-135m float32; load average (1 / 5 / 15 min) {loads[0]} at the "
        f"start, {loads[1]} at the end; one run per size (no repeats). Unit: the median of three plain "
        "SDPA forwards of the same ids; wall-time ratio, CPU-time ratio in brackets. The corrupted "
        "prompt replaces the middle token (so half the text is a prefix both prompts share: patching "
        "runs it once into a KV cache); the metric is the normalised logit difference of the clean vs "
        "the corrupted top prediction.\n\n"
        "| N | forward | real head grid (270 patched forwards, batched) | attribution patching, every "
        "head × position (≤ 4x; estimate) | top-20 verification (≤ 20x) | Spearman, estimate vs real "
        "head grid | worst head: estimate / real | worst of the top-20: abs(estimate − real) |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        fmt = lambda k, r=r: f"{r[k][0]:.2f}x ({r[k][1]:.2f}x)" if k in r else "not run"  # noqa: E731
        worst = (
            f"L{r['worst'][0][0]} H{r['worst'][0][1]}: {r['worst'][1]:.3f} / {r['worst'][2]:.3f}"
            if "worst" in r
            else "–"
        )
        rho = f"{r['spearman']:.3f}" if "spearman" in r else "–"
        lines.append(
            f"| {r['n']} | {r['floor_s']:.3f} s | {fmt('grid')} | {fmt('atp')} | {fmt('verify')} | {rho} "
            f"| {worst} | {r['top_worst']:.3f} |"
        )
    return head + "\n".join(lines) + "\n"


def write_patching(body: str) -> None:
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text()
    if P_START in text:
        a, b = text.index(P_START) + len(P_START), text.index(P_END)
        text = text[:a] + "\n" + body + text[b:]
    else:
        title = "## Explain: activation patching and attribution patching (issue 33)"
        text += f"\n{title}\n\n{P_START}\n{body}{P_END}\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2048,8192")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--patching", action="store_true", help="the activation / attribution patching rows")
    ap.add_argument("--grid-max", type=int, default=512, help="patching: the real head grid up to this N")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    lm = attnviz.load_model("smollm2-135m")
    start = load()
    print(f"load average at the start: {start}", flush=True)
    if args.patching:
        prow = [bench_patching(lm, n, args.grid_max) for n in sizes]
        body = patching_markdown(prow, (start, load()))
        print(body)
        if not args.no_write:
            write_patching(body)
        return 0
    rows = [bench(lm, n, args.repeats) for n in sizes]
    body = markdown(rows, args.repeats, sizes, (start, load()))
    print(body)
    if not args.no_write:
        write(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
