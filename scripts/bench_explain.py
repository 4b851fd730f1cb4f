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
from attnviz.explain.residual import forward_kwargs  # noqa: E402

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
            lm.model(input_ids=torch.tensor([ids], device=lm.device), **forward_kwargs(lm))
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2048,8192")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    lm = attnviz.load_model("smollm2-135m")
    start = load()
    print(f"load average at the start: {start}", flush=True)
    rows = [bench(lm, n, args.repeats) for n in sizes]
    body = markdown(rows, args.repeats, sizes, (start, load()))
    print(body)
    if not args.no_write:
        write(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
