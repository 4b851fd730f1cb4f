"""UI benchmark: submit-to-first-view against one plain forward, redraw after a head change, payload.

    .venv/bin/python scripts/bench_ui.py [--sizes 128,1024,4096] [--repeats 3] [--no-write]
    .venv/bin/python scripts/bench_ui.py --browser [--sizes 1500,8192] [--pages 1500] [--repeats 2]

``--browser`` measures what a person sees, in a real browser: the app server runs as
`streamlit run app.py` on a loopback port (as in tests/server.py), Debian's Chromium (Playwright,
``/usr/bin/chromium``) opens it with the default sentence (model loaded), then the text is pasted
into the sidebar's text box and submitted (Ctrl+Enter). "first view" is the time from the key press
until the first heatmap of the new text is drawn (its Plotly SVG image in the page); "whole page"
until the run is over and every chart is drawn. Before the timed submits of a size, one untimed
submit of that size warms the server (its first forward of a size pays one-off allocations).
Each repeat uses a fresh text of the same length (a different first word: no cache hit; the page
walk's texts differ from these, and a timed submit that ran no forward stops the bench), and one
plain SDPA forward of the same text is measured in this process right after each browser run
(the server is idle then): the median of three forwards, so one forward slowed by the last
drawing (or a lucky one) does not set the ratio; ratios are medians of the per-repeat ratios.
On a shared machine wall-clock ratios move with the load, so the same ratio is also given in
CPU time: the server process's CPU seconds from the key press to the first view
over the bench process's CPU seconds for the forward. Results go into docs/benchmarks.md between
the ui-browser markers. With ``--pages N`` (default 1500; 0: none) the same browser then times each
page and control at N tokens (scripts/bench_ui_pages.py: a head and a layer change, Model
overview, Generation, a page switch back), into the ui-pages markers.

Runs app.py in Streamlit's AppTest (the real script, in-process) on the built-in smollm2-135m.
The first run extracts (cached); then the head selector changes `--repeats` times and each rerun is
timed: that is the server's work for a head change (the model never reruns). Payload = bytes of
the Plotly figure JSON the view sends to the browser. "first view / forward" divides the first run
of a text (extract + every view drawn; the model is loaded by a warm-up run first) by one plain SDPA
forward of the same ids measured right after in the same process (`attnviz.bench.extraction` floor). Results
go into docs/benchmarks.md between the ui markers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import attnviz  # noqa: E402
from attnviz.bench.common import floor, ids_of_length, replace_section  # noqa: E402


def text_of(lm: attnviz.LoadedModel, n: int) -> str:
    return lm.tokenizer.decode(ids_of_length(lm, n))


def payload(at: AppTest) -> int:
    return sum(len(c.proto.spec) for c in at.get("plotly_chart"))


def forward_seconds(lm: attnviz.LoadedModel, n: int) -> float:
    """One plain SDPA forward of the same n ids (no capture): the floor (best of 2 after a warm-up)."""
    run = floor(lm, ids_of_length(lm, n))
    run()  # warm-up: the first call of a size pays one-off allocation costs
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(text: str, repeats: int) -> tuple[float, float, int, int]:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=900)
    at.query_params["model"] = "smollm2-135m"
    at.query_params["text"] = text
    t0 = time.perf_counter()
    at.run()
    first = time.perf_counter() - t0
    if at.exception:
        raise RuntimeError(at.exception[0].value)
    times = []
    for i in range(repeats):
        at.selectbox(key="head").set_value((i + 1) % 9)
        t0 = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - t0)
        if at.exception:
            raise RuntimeError(at.exception[0].value)
    charts = at.get("plotly_chart")
    return first, statistics.median(times) if times else 0.0, payload(at), len(charts)


def sizes(spec: str) -> list[int]:
    return [int(s) for s in spec.split(",") if s.strip()]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default=None, help="token counts (default 128,1024,4096; browser 1024,8192)")
    ap.add_argument("--repeats", type=int, default=None, help="default 3 (browser: 2 per size)")
    ap.add_argument("--browser", action="store_true", help="time it in Chromium against the real server")
    ap.add_argument(
        "--pages", type=int, default=1500, help="browser: the page-costs table at this many tokens (0: none)"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    lm = attnviz.load_model("smollm2-135m", device="cpu")
    if args.browser:
        from bench_ui_browser import run_browser

        ns = sizes(args.sizes) if args.sizes is not None else [1500, 8192]
        return run_browser(lm, ns, args.repeats or 2, args.out, args.no_write, args.pages)
    args.sizes = args.sizes or "128,1024,4096"
    args.repeats = 3 if args.repeats is None else args.repeats
    measure("warm up: load the model", 0)  # the first view of each size then excludes the load
    header = (
        "| N tokens | first view (extract + draw) | one plain forward | first view / forward | "
        "redraw after a head change (median) | payload of the view (figure JSON) | figures |\n"
        "|---|---|---|---|---|---|---|"
    )
    lines = []
    sys.stdout.write(header + "\n")
    for n in sizes(args.sizes):
        first, redraw, size, charts = measure(text_of(lm, n), args.repeats)
        floor = forward_seconds(lm, n)
        line = (
            f"| {n} | {first:.2f} s | {floor:.2f} s | {first / floor:.2f}x | {redraw:.3f} s | "
            f"{size / 2**20:.2f} MB | {charts} |"
        )
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        lines.append(line)
    if not args.no_write:
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        replace_section(
            args.out,
            "ui",
            f"Measured {stamp} with `python scripts/bench_ui.py` (AppTest, in-process, CPU, "
            f"smollm2-135m, median of {args.repeats} head changes).\n\n{header}\n" + "\n".join(lines),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
