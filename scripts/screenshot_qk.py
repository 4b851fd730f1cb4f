"""README screenshot docs/img/why_head.png: "why this head attends" on the built-in SmolLM2.

Runs the app on the built-in smollm2-135m (offline) and opens the Explain page's "why this head
attends" view for SmolLM2's induction head L17H3 on a repeated sentence: the query is the second
"was", the key the token after the first "was" ("quiet"), split by layer of origin. Saves a
headless Chromium screenshot (Playwright, the system Chromium). About a minute on 2 cores.

    python scripts/screenshot_qk.py [out.png]
"""

from __future__ import annotations

import sys
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from screenshot_app import ROOT, screenshot_app  # also puts the root and tests/ on the path

TEXT = "The river bank was quiet at dawn. The river bank was quiet at dawn."
PARAMS = {
    "model": "smollm2-135m", "text": TEXT, "view": "why this head attends",
    "wl": "17", "wh": "3", "pos": "11", "wk": "4", "wby": "layer",
}  # fmt: skip


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs" / "img" / "why_head.png")
    screenshot_app(
        f"/Explain?{urllib.parse.urlencode(PARAMS)}", out, height=1500, wait_ms=300_000, settle_ms=5000
    )
    print(out)
