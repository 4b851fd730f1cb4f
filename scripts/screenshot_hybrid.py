"""README screenshot docs/img/hybrid.png: the Explorer on a Qwen3.5-shaped tiny random hybrid.

Builds a tiny Qwen3.5 text model (random weights; three Gated DeltaNet blocks then one attention
block, like Qwen3.5's 3:1 pattern, 4 value heads) with tests/tiny.py's tokenizer, saves it as a
local folder, runs the app on it and saves a headless Chromium screenshot of block 0 (a Gated
DeltaNet block) with Playwright and the system Chromium. Offline; about a minute.

    python scripts/screenshot_hybrid.py [out.png]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from screenshot_app import ROOT, screenshot_app  # also puts the root and tests/ on the path

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
        query = urllib.parse.urlencode({"model": str(folder), "text": TEXT})
        screenshot_app(f"/?{query}", out, height=1400, wait_ms=120_000, settle_ms=3000)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(out)
