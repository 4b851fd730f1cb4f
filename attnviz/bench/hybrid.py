"""`python -m attnviz.bench.hybrid`: a Qwen3.5-shaped hybrid (Gated DeltaNet + attention) on the CPU.

The model: Qwen3.5-0.8B-like dims (hidden 1024; Gated DeltaNet 16 key / 16 value heads × 128;
attention 8 heads / 2 KV heads × 256; MLP 3584), 4 blocks (3 Gated DeltaNet + 1 attention), vocab
32000, random weights, fp32. At each N, in one process:

  (a) plain   - one forward (SDPA, no capture; `attnviz.bench.common.floor`)
  (b) capture - `extract_ids` (fast path: attention Q/K and every mixer's kernel inputs kept)
  (c) pooled  - one Gated DeltaNet head's pooled view, 256 × 256 bins (`res.mixer_pooled`)

Ratios are to (a) in the same run; times are medians of --repeats. Targets (issue 30):
(b)/(a) ≤ 1.2, (c)/(a) ≤ 0.5 at 8k.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import sys
from pathlib import Path

import torch

from ..extract import extract_ids
from ..loading import LoadedModel, wrap_model
from .common import floor, machine_line, measure, replace_section

VOCAB = 32000


def qwen35_shaped(blocks: int = 4) -> LoadedModel:
    """The hybrid above, wrapped for `extract`."""
    import transformers as tf

    cfg = tf.Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=1024, intermediate_size=3584, num_hidden_layers=blocks,
        num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
        layer_types=["linear_attention"] * (blocks - 1) + ["full_attention"],
        max_position_embeddings=65536,
    )  # fmt: skip
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=_word_level(), pad_token="t0")
    return wrap_model(model, tok, spec="qwen3.5-0.8b-shaped hybrid (random, 4 blocks)")


def _word_level():
    from tokenizers import Tokenizer, models

    return Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))


def bench(lm: LoadedModel, n: int, repeats: int) -> str:
    ids = [(7 + 31 * i) % VOCAB for i in range(n)]
    plain_s, _ = measure(floor(lm, ids), lm.device, repeats)
    holder: dict = {}

    def capture() -> object:
        holder["res"] = extract_ids(lm, ids, max_tokens=n)
        return holder["res"]

    capture_s, _ = measure(capture, lm.device, repeats)
    res = holder["res"]
    pooled_s, _ = measure(lambda: res.mixer_pooled(0, "gated_delta", 0, cells=256), lm.device, repeats)
    check = res.mixer_check(0, "gated_delta")
    return (
        f"| {n} | {plain_s:.2f} s | {capture_s:.2f} s | {capture_s / plain_s:.2f} | {pooled_s:.2f} s | "
        f"{pooled_s / plain_s:.2f} | {check.max_abs_diff:.0e} at scale {check.scale:.0e} |"
    )


def row_at(n: int, heads: int = 16, d: int = 128) -> str:
    """One Gated DeltaNet head's last row at ``n`` tokens from synthetic kernel inputs (random
    unit q/k, decays in (0.9, 1), β in (0, 1); no forward: a forward at 32k does not fit this bench)."""
    import time

    from ..mixers import delta

    g = torch.Generator().manual_seed(0)
    q, k = (
        torch.nn.functional.normalize(torch.randn(n, heads, d, generator=g, dtype=torch.float64), dim=-1)
        for _ in "qk"
    )
    parts = {
        "q": q * d**-0.5,
        "k": k,
        "a": (0.9 + 0.1 * torch.rand(n, heads, 1, generator=g, dtype=torch.float64)).expand(n, heads, d),
        "beta": torch.rand(n, heads, generator=g, dtype=torch.float64),
    }
    t0 = time.perf_counter()
    row = delta.delta_rows(parts, [0], torch.tensor([n - 1]))
    seconds = time.perf_counter() - t0
    what = f"one GDN head's row at {n} tokens (d = {d}, backward scan, float64)"
    return f"{what}: {seconds:.2f} s, {row.shape[-1]} keys"


HEADER = (
    "| N | (a) plain forward | (b) forward with capture | (b)/(a) | (c) one GDN head pooled 256² | "
    "(c)/(a) | block 0 self-check |\n|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnviz.bench.hybrid", description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="2048,8192", help="comma-separated token counts")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="write the rows into this Markdown file")
    ap.add_argument(
        "--row-tokens", type=int, default=0, help="also time one head's row at this N (e.g. 32768)"
    )
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    lm = qwen35_shaped()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"{when}; {machine_line(torch.device('cpu'))}; load average {load} (a shared machine: "
        f"other processes ran meanwhile); medians of {args.repeats}",
        "",
        HEADER,
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    for n in (int(t) for t in args.tokens.split(",") if t):
        lines.append(bench(lm, n, args.repeats))
        sys.stdout.write(lines[-1] + "\n")
        sys.stdout.flush()
    if args.row_tokens:
        lines += ["", row_at(args.row_tokens)]
        sys.stdout.write(lines[-1] + "\n")
    if args.out is not None:
        replace_section(args.out, "hybrid", "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
