"""Driver of `make gpu-check` (scripts/gpu_check.sh installs what it needs, then runs this).

1. the GPU suite: ``pytest -m gpu`` (tests/engine/test_gpu.py: every log-sum-exp entry point against the
   dense oracle on tiny architectures and the built-in model, fp32 and bf16; fails on any fallback);
2. the benchmark rows of the Llama-3.2-3B-shaped random bf16 model (attnviz/bench/gpu.py) at 1k, 8k,
   32k and, when memory and the time budget allow, 128k tokens;
3. the hybrid rows (attnviz/bench/gpu_hybrid.py): Qwen3.5- and Bamba-shaped random bf16 models,
   which kernel transformers bound behind each mixer (fla / mamba_ssm / causal_conv1d or the torch
   body), a forward and extract with every mixer's self-check at 1k and 8k tokens (``--no-hybrid``
   leaves them out);
4. one Markdown report: ``--out`` (default test-output/gpu-check.md) and the ``gpu-check`` section of
   docs/benchmarks.md (unless ``--no-write``). Exit status 1 on any failure (a test, an error, a
   fallback path), 0 otherwise; ``--strict`` also fails on a missed target. Without a GPU: one line,
   status 0.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE_TIMEOUT = 240  # seconds for `pytest -m gpu`; the benchmark gets what is left of the budget


def run_suite(timeout: float) -> tuple[str, bool]:
    """(pytest's summary line, passed) of the GPU suite."""
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests"]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f} s", False
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    sys.stdout.write(done.stdout[-4000:])
    return (lines[-1] if lines else f"pytest exited {done.returncode}"), done.returncode == 0


def main(argv: list[str] | None = None, model: Callable | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "test-output" / "gpu-check.md")
    parser.add_argument("--benchmarks", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/benchmarks.md")
    parser.add_argument("--sizes", default="1024,8192,32768,131072")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=520.0, help="seconds for everything")
    parser.add_argument("--skip-tests", action="store_true", help="benchmark only")
    parser.add_argument("--strict", action="store_true", help="a missed target is a failure too")
    parser.add_argument("--no-hybrid", action="store_true", help="leave out the hybrid rows")
    parser.add_argument("--hybrid-sizes", default="1024,8192")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(",") if s.strip())
    from attnviz import backend

    cuda = backend.backend()
    if not cuda.available():
        sys.stdout.write("gpu-check: torch sees no CUDA GPU on this machine; nothing was run\n")
        return 0
    t0 = time.perf_counter()
    tests, passed = ("skipped (--skip-tests)", True)
    if not args.skip_tests:
        tests, passed = run_suite(min(SUITE_TIMEOUT, args.budget / 2))
    from attnviz.bench import gpu
    from attnviz.bench.common import llama3b_shaped, replace_section

    lm = (model or llama3b_shaped)(cuda.device())
    left = args.budget - (time.perf_counter() - t0)
    report = gpu.run(lm, sizes, repeats=args.repeats, budget_s=max(60.0, left - 90.0))
    del lm
    cuda.empty_cache()
    report.tests = tests
    if not passed:
        report.failures.insert(0, f"GPU suite: {tests}")
    if args.strict:
        report.failures += [f"target not met: {what}" for what, ok in gpu.targets(report) if not ok]
    text = gpu.markdown(report)
    if not args.no_hybrid:
        from attnviz.bench import gpu_hybrid

        hybrid_sizes = tuple(int(s) for s in args.hybrid_sizes.split(",") if s.strip())
        hybrid, why = gpu_hybrid.rows(hybrid_sizes, repeats=args.repeats)
        report.failures += gpu_hybrid.failures(hybrid)
        text += "\n\n" + gpu_hybrid.markdown(hybrid, why)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(f"# GPU check\n\n{text}\n")
    if not args.no_write:
        replace_section(args.benchmarks, "gpu-check", text)
    sys.stdout.write(f"{text}\n\nwrote {args.out}\n")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
