"""README screenshot docs/img/why_head.png: "why this head attends" on the built-in SmolLM2.

Runs the app on the built-in smollm2-135m (offline) and opens the Explain page's "why this head
attends" view for SmolLM2's induction head L17H3 on a repeated sentence: the query is the second
"was", the key the token after the first "was" ("quiet"), split by layer of origin. Saves a
headless Chromium screenshot (Playwright, the system Chromium). About a minute on 2 cores.

    python scripts/screenshot_qk.py [out.png]
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

TEXT = "The river bank was quiet at dawn. The river bank was quiet at dawn."
PARAMS = {
    "model": "smollm2-135m", "text": TEXT, "view": "why this head attends",
    "wl": "17", "wh": "3", "pos": "11", "wk": "4", "wby": "layer",
}  # fmt: skip


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs" / "img" / "why_head.png")
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
            page = browser.new_page(viewport={"width": 1400, "height": 1500})
            page.goto(f"http://127.0.0.1:{port}/Explain?{urllib.parse.urlencode(PARAMS)}")
            page.wait_for_selector('[data-testid="stPlotlyChart"] .js-plotly-plot', timeout=300_000)
            page.wait_for_timeout(5000)  # the charts finish drawing
            page.screenshot(path=str(out), full_page=False)
    finally:
        app.terminate()
        app.wait(timeout=30)
    print(out)
