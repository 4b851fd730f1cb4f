"""The benchmarks' CUDA code and `make gpu-check`, on the CPU under the CUDA emulation (tiny models
stand for smollm2 and the Llama-3.2-3B-shaped model), and the check's answer on a machine without
a GPU."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cuda_emulation import emulate
from sharp_models import sharp

from attnviz.bench import extraction, gpu, stats
from attnviz.cli import _parser as build_parser

ROOT = Path(__file__).resolve().parents[2]


def _tiny_models(monkeypatch, arch: str = "llama-gqa") -> None:
    """smollm2 and the Llama-3B-shaped model both become a tiny model (its table row at 20 tokens)."""
    lm = sharp(arch)
    monkeypatch.setattr(extraction, "load_model", lambda spec, device: lm)
    monkeypatch.setattr(stats, "load_model", lambda spec, device: lm)
    monkeypatch.setattr(extraction, "llama3b_shaped", lambda device: lm)
    monkeypatch.setattr(stats, "llama3b_shaped", lambda device: lm)
    monkeypatch.setattr(extraction, "LLAMA_AT", 20)


@pytest.mark.slow  # each measurement collects garbage first: ~30 s on 2 shared cores
def test_bench_on_cuda_runs_its_tables_and_the_statistics(monkeypatch, capsys):
    """`attnviz bench --device cuda` used to delete `lm` twice: UnboundLocalError after its first table."""
    _tiny_models(monkeypatch)
    args = build_parser().parse_args(
        ["bench", "--device", "cpu", "--sizes", "24", "--repeats", "1", "--no-write", "--llama-sizes", "16"]
    )
    with emulate() as cuda:
        assert extraction.run_bench(args) == 0
    out = capsys.readouterr().out
    assert "emulated CUDA" in out  # the machine line came through the seam
    table = [ln for ln in out.splitlines() if ln.startswith("| tiny-llama-gqa-sharp |")]
    assert [ln.split("|")[2].strip() for ln in table] == ["24", "20", "24", "16"]  # table + Llama row, stats
    assert cuda.synced and cuda.calls  # timings synchronised; the statistics ran the efficient kernel


@pytest.mark.slow
def test_stats_bench_takes_the_llama_sizes(monkeypatch, capsys):
    _tiny_models(monkeypatch)
    with emulate():
        assert stats.main(["--sizes", "16", "--repeats", "1", "--no-write", "--llama-sizes", "20"]) == 0
        assert stats.main(["--sizes", "16", "--repeats", "1", "--no-write", "--llama-sizes", ""]) == 0
    rows = [
        ln.split("|")[2].strip() for ln in capsys.readouterr().out.splitlines() if ln.startswith("| tiny")
    ]
    assert rows == ["16", "20", "16"]
    with pytest.raises(SystemExit):
        stats.main(["--llama-sizes", "1"])


@pytest.mark.slow
def test_gpu_check_rows_and_report_on_the_emulated_device(monkeypatch):
    lm = sharp("llama-gqa")
    monkeypatch.setattr(gpu, "HEAD_SIDE", 16)  # the first head and the view pooled, as past 632 tokens
    with emulate() as cuda:
        report = gpu.run(lm, (32,), repeats=1, view_at=32, layout_at=32, drift_tokens=24)
    assert [r.n for r in report.rows] == [32] and not report.failures, report.failures
    assert report.rows[0].view is not None and set(report.layout) == {
        "split (rf kernels)",
        "one call (general kernel)",
    }
    assert len(report.drift) == 3 and cuda.synced
    text = gpu.markdown(report)
    assert "| 32 |" in text and "head view 32" in text and "met: no fallback path" in text
    with emulate(refuse="cutlassF: no kernel found to launch!"):  # every fused pass refuses
        broken = gpu.run(lm, (32,), repeats=1, view_at=0, layout_at=0, drift_tokens=24)
    assert any("blocked: no efficient kernel" in f for f in broken.failures)
    assert "NOT met: no fallback path" in gpu.markdown(broken)


def _driver():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_gpu_check_driver_on_the_emulated_device(tmp_path, capsys):
    bench_md = tmp_path / "benchmarks.md"
    bench_md.write_text("# Benchmarks\n\n<!-- gpu-check:start -->\nnot measured\n<!-- gpu-check:end -->\n")
    argv = ["--skip-tests", "--sizes", "32", "--repeats", "1", "--out", str(tmp_path / "r.md"),
            "--benchmarks", str(bench_md), "--hybrid-sizes", "32"]  # fmt: skip
    with emulate():
        assert _driver().main(argv, model=lambda device: sharp("llama-gqa")) == 0
    report = (tmp_path / "r.md").read_text()
    assert report.startswith("# GPU check") and "| 32 |" in report
    assert "| Qwen3.5-shaped | 32 |" in report and "| Bamba-shaped | 32 |" in report  # the hybrid rows
    assert "not measured" not in bench_md.read_text() and "| 32 |" in bench_md.read_text()
    with emulate(refuse="cutlassF: no kernel found to launch!"):
        assert _driver().main([*argv, "--no-write"], model=lambda device: sharp("llama-gqa")) == 1


def test_gpu_check_without_a_gpu_says_so_in_one_line():
    t0 = time.perf_counter()
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "NVIDIA_SMI": "false"},
    )  # fmt: skip
    assert done.returncode == 0 and time.perf_counter() - t0 < 10
    assert done.stdout.count("\n") == 1 and "no CUDA GPU" in done.stdout, done.stdout
    assert "gpu-check:" in (ROOT / "Makefile").read_text()


def test_gpu_check_driver_without_a_gpu(capsys):
    assert _driver().main(["--skip-tests"]) == 0  # the real seam: this machine has no CUDA
    assert capsys.readouterr().out.strip().count("\n") == 0


def test_cli_bench_parses_llama_sizes():
    args = build_parser().parse_args(["bench", "--llama-sizes", "1024, 8192"])
    assert isinstance(args, argparse.Namespace) and args.llama_sizes == "1024,8192"
    assert sys.modules["attnviz.bench.stats"].CUDA_SIZES == [1024, 8192, 32768, 131072]


def test_every_benchmark_times_cuda_by_one_protocol(monkeypatch):
    """`common.measure` (extraction, families, hybrid benches) and `gpu.timed` (make gpu-check) time
    a CUDA run the one way, `common.cuda_run`: garbage collected, synchronised, peak counter reset,
    the run, synchronised again; the peak is what the run allocated above the start. Guards the two
    written-out copies drifting apart (only one of them collected garbage first)."""
    import gc

    from attnviz.bench import common

    events: list[str] = []
    monkeypatch.setattr(gc, "collect", lambda *a: events.append("gc") or 0)
    with emulate() as cuda:
        memory = cuda.allocator
        monkeypatch.setattr(cuda, "synchronize", lambda device: events.append("sync"))
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device: events.append("reset"))
        monkeypatch.setattr(
            cuda, "memory_allocated", lambda device: events.append("base") or memory.allocated
        )
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda device: events.append("peak") or memory.peak)

        def run() -> str:
            events.append("run")
            memory.peak = memory.allocated + 100
            return "output"

        memory.allocated = 7
        one = ["gc", "sync", "reset", "base", "run", "sync", "peak"]
        assert common.measure(run, torch.device("cpu"), 2)[1] == 100 and events == one * 2
        events.clear()
        timed, out = gpu.timed(run, torch.device("cpu"), 2)
        assert (timed.peak, out) == (100, "output") and events == one * 2
