"""The demo soak (`scripts/demo_soak.py`) for 3 minutes: a demo server with the real built-in
model and a light mix of visitors (staying, leaving, editing, Explain, patching, atlas); memory
flat after warm-up (final within 1.1x of the minute-1 mark), every health check answered and
healthy, no ERROR line in the server's log, the result cache within its bound, the queue drained.
The hour's figures: docs/robustness.md ("An hour of demo")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RESULT_CACHE_ENTRIES = 16  # ui.models.RESULT_CACHE_ENTRIES


def test_three_minutes_of_demo_hold(tmp_path):
    out = tmp_path / "soak.json"
    cmd = [sys.executable, "scripts/demo_soak.py", "--minutes", "3", "--every", "6", "--texts", "24",
           "--json", str(out), "--log", str(tmp_path / "server.log")]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(out.read_text())["summary"]
    print(json.dumps(summary, indent=1))
    assert summary["visitors"] >= 10
    assert summary["health_bad"] == 0 and summary["health_ok"] >= 10
    assert summary["error_lines"] == 0, (tmp_path / "server.log").read_text()[-3000:]
    assert summary["final_over_warm"] <= 1.1
    assert summary["result_cache_entries"] <= RESULT_CACHE_ENTRIES
    assert summary["drained"] and summary["unfinished_visitors"] == 0
    assert done.returncode == 0 and summary["passed"], done.stdout[-3000:]
