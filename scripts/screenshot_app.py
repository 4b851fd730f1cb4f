"""Start the app on a free loopback port and screenshot one of its URLs once its charts are drawn:
the one helper behind `screenshot_qk.py` and `screenshot_hybrid.py`."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def screenshot_app(url_path: str, out: Path, *, height: int, wait_ms: int, settle_ms: int) -> None:
    """Screenshot ``url_path`` (page and query, e.g. ``/Explain?model=...``) at 1400 × ``height``
    into ``out``, after the first chart appears (waiting ``wait_ms`` at most) and ``settle_ms`` more."""
    from browser_page import chromium
    from server import free_port, server_env

    port = free_port()
    app = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.headless=true",
         f"--server.port={port}", "--server.address=127.0.0.1"],
        cwd=ROOT, env=server_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(8)
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 1400, "height": height})
            page.goto(f"http://127.0.0.1:{port}{url_path}")
            page.wait_for_selector('[data-testid="stPlotlyChart"] .js-plotly-plot', timeout=wait_ms)
            page.wait_for_timeout(settle_ms)  # the charts finish drawing
            page.screenshot(path=str(out), full_page=False)
    finally:
        app.terminate()
        app.wait(timeout=30)
