"""README screenshot docs/img/hybrid.png: the Explorer on a Qwen3.5-shaped tiny random hybrid.

Builds a tiny Qwen3.5 text model (random weights; three Gated DeltaNet blocks then one attention
block, like Qwen3.5's 3:1 pattern, 4 value heads) with tests/tiny.py's tokenizer, saves it as a
local folder, runs the app on it and saves a headless Chromium screenshot of block 0 (a Gated
DeltaNet block) with Playwright and the system Chromium. Offline; about a minute.

    python scripts/screenshot_hybrid.py [out.png]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

TEXT = "the bank of the river is where the fox jumps"


def build(folder: Path) -> None:
    import tiny
    import torch
    import transformers as tf

    cfg = tf.Qwen3_5TextConfig(
        vocab_size=tiny.VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        full_attention_interval=4,  # blocks 0-2 Gated DeltaNet, block 3 attention
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(cfg).eval().save_pretrained(folder)
    tiny.tokenizer().save_pretrained(folder)


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs" / "img" / "hybrid.png")
    folder = Path(tempfile.gettempdir()) / "qwen3.5-tiny-random"  # the name the page shows
    shutil.rmtree(folder, ignore_errors=True)
    try:
        build(folder)
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
            query = urllib.parse.urlencode({"model": str(folder), "text": TEXT})
            with chromium() as browser:
                page = browser.new_page(viewport={"width": 1400, "height": 1400})
                page.goto(f"http://127.0.0.1:{port}/?{query}")
                page.wait_for_selector('[data-testid="stPlotlyChart"] .js-plotly-plot', timeout=120_000)
                page.wait_for_timeout(3000)  # the charts finish drawing
                page.screenshot(path=str(out), full_page=False)
        finally:
            app.terminate()
            app.wait(timeout=30)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(out)
