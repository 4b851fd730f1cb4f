"""CPU seconds of the headless browser a benchmark drives: shared by the UI benchmarks."""

from __future__ import annotations

import os

import psutil


def chromium_cpu() -> float:
    """CPU seconds of every Chromium process under this one (Playwright's browser)."""
    total = 0.0
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if "chrom" in p.name().lower():
                total += sum(p.cpu_times()[:2])
        except psutil.NoSuchProcess:
            continue
    return total
