"""`python -m attnviz.bench.hybrid_explain`: what explaining a Qwen3.5-shaped hybrid costs (issue 39).

The model: Qwen3.5-0.8B's text shape with random weights (`qwen35_08b`: hidden 1024, MLP 3584;
Gated DeltaNet 16 key / 16 value heads × 128, short conv 4; gated attention 8 heads / 2 KV heads ×
256, partial rotary 0.25; vocab 248,320, tied embeddings; 24 blocks, 3 Gated DeltaNet : 1
attention), float32 on the CPU. ``--blocks`` keeps that per-block shape with fewer blocks (the
pattern kept: every fourth block is attention), since every row below is per-block dominated.

At each N, repeat by repeat (interleaved, so other people's load falls on all alike), in one process:

  floor     one plain forward: the model's own default attention (SDPA), ``use_cache=False``,
            logits at the last position only (`attnviz.bench.common.floor`); the unit of every ratio
  stream    `attnviz.explain.read_stream` alone: the forward with the residual stream at every block
            boundary, each part's write and each per-head mixer's out_proj input kept
  trace     `attnviz.explain.block_trace`: the same forward also capturing every attention call
            and every mixer's kernel inputs, each block's parts self-checked (what routes read)
  lens      `attnviz.logit_lens` of the last 16 positions (k = 5) from the trace's stream
  dla       `attnviz.explain.block_attribution` of the last token (per-head mixer pieces included)
  routes    `attnviz.information_flow` from the trace
  total     trace + lens + dla + routes: "trace + every readout", budget ≤ 1.3x
  patch     residual patching of one (block, position) cell: the one patched forward
            (`explain.patching.run_cells`), after the two prompts' capture runs (``setup``, shown apart)
  atp       `attnviz.attribution_patch(..., over="heads_by_position", verify=0)`: every head ×
            position estimated (two forwards, one backward), budget ≤ 4x

Each ratio is the repeat's time over that repeat's floor, in process CPU time (the bench process'
own CPU seconds: read it with one thread, ``OMP_NUM_THREADS=1``) and in wall time; cells are
medians over the repeats.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import sys
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from ..errors import AttnvizError
from ..loading import LoadedModel, wrap_model
from .common import floor, machine_line, replace_section, timed

log = logging.getLogger(__name__)

VOCAB = 248320
BLOCKS = 24
LENS_POSITIONS = 16
BUDGETS = {"total": 1.3, "atp": 4.0}
ROWS = ("stream", "trace", "lens", "dla", "routes", "total", "setup", "patch", "atp")


def qwen35_08b(blocks: int = BLOCKS, vocab: int = VOCAB) -> LoadedModel:
    """Qwen3.5-0.8B's text model shape (see the module docstring) with random weights, float32,
    ``blocks`` blocks (every fourth one attention, as in the model), wrapped for attnviz."""
    import transformers as tf

    cfg = tf.Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=1024, intermediate_size=3584, num_hidden_layers=blocks,
        num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, tie_word_embeddings=True, max_position_embeddings=262144,
        layer_types=["full_attention" if b % 4 == 3 else "linear_attention" for b in range(blocks)],
        rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
    )  # fmt: skip
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=_word_level(vocab), pad_token="t0")
    return wrap_model(model, tok, spec=f"qwen3.5-0.8b-shaped (random, {blocks} blocks)")


def _word_level(vocab: int) -> Any:
    from tokenizers import Tokenizer, models

    return Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(vocab)}, unk_token="t0"))


def prompts(n: int, vocab: int) -> tuple[list[int], list[int]]:
    """(clean, corrupted) ids of length ``n``: the corrupted one differs at position n // 2."""
    clean = [(7 + 31 * i) % vocab for i in range(n)]
    corrupted = list(clean)
    corrupted[n // 2] = (clean[n // 2] + 1) % vocab
    return clean, corrupted


def one_repeat(
    lm: LoadedModel, clean: list[int], corrupted: list[int], skip: Collection[str] = ()
) -> dict[str, tuple[float, float]]:
    """(wall, CPU) seconds of the floor and of each row, in one repeat (``skip``: "patch" (setup and
    the patched forward), "atp")."""
    from ..explain import attribution_patch

    gc.collect()  # once per repeat (a full collection costs most of a second here)
    secs: dict[str, tuple[float, float]] = {"floor": timed(floor(lm, clean))[:2]}
    secs.update(_readouts(lm, clean))
    if "patch" not in skip:
        secs.update(_residual_patch(lm, clean, corrupted))
    if "atp" not in skip:
        atp = lambda: attribution_patch(lm, clean, corrupted, over="heads_by_position", verify=0)  # noqa: E731
        secs["atp"] = timed(atp)[:2]
    return secs


def _readouts(lm: LoadedModel, ids: list[int]) -> dict[str, tuple[float, float]]:
    """The stream alone; then the hybrid's trace (`block_trace`: the stream and every mixing
    branch's parts, checked), each readout from it, and their total ("trace + every readout")."""
    from ..explain import block_attribution, block_trace, information_flow, logit_lens, read_stream

    secs: dict[str, tuple[float, float]] = {}
    w, c, st = timed(lambda: read_stream(lm, ids))
    secs["stream"] = (w, c)
    traced: Any = None
    try:
        w, c, traced = timed(lambda: block_trace(lm, ids))
        secs["trace"] = (w, c)
        st = traced.stream
    except AttnvizError as err:  # the readouts then read the stream alone
        log.warning("block_trace refused: %s", err)
    positions = list(range(len(ids) - LENS_POSITIONS, len(ids)))
    secs["lens"] = timed(lambda: logit_lens(lm, st, positions))[:2]
    secs["dla"] = timed(lambda: block_attribution(lm, st))[:2]
    if traced is not None:
        try:
            secs["routes"] = timed(lambda: information_flow(lm, traced))[:2]
        except AttnvizError as err:
            log.warning("routes refused: %s", err)
    parts = [secs[k] for k in (total_parts(secs))]
    secs["total"] = (sum(p[0] for p in parts), sum(p[1] for p in parts))
    return secs


def total_parts(secs: Collection[str]) -> list[str]:
    """The rows "trace + every readout" adds up: the trace (the stream alone where `block_trace`
    refused), the lens, DLA and routes (where they ran)."""
    first = "trace" if "trace" in secs else "stream"
    return [first, "lens", "dla", *(["routes"] if "routes" in secs else [])]


Seconds = dict[str, tuple[float, float]]  # row -> (wall, CPU)


def _residual_patch(lm: LoadedModel, clean: list[int], corrupted: list[int]) -> Seconds:
    """The two prompts' capture runs, then one patched forward: the stream entering the middle
    block at the corrupted position."""
    from ..explain.patching import patch_at, run_cells, setup

    w, c, s = timed(lambda: setup(lm, clean, corrupted, None, None, "residual", "denoise", keep_target=False))
    cell = patch_at("residual", (len(s.st.blocks) // 2, len(clean) // 2), s.pairing, s.st.parts)
    return {"setup": (w, c), "patch": timed(lambda: run_cells(lm, s, [cell], batch=1))[:2]}


def bench(lm: LoadedModel, n: int, repeats: int, skip: Collection[str] = ()) -> dict[str, Any]:
    """Medians over ``repeats`` of each row's (wall, CPU) ratio to the floor, and the floor's seconds."""
    clean, corrupted = prompts(n, lm.model.config.get_text_config().vocab_size)
    floor(lm, clean)()  # warm-up
    ratios: dict[str, list[tuple[float, float]]] = {}
    floors: list[tuple[float, float]] = []
    for r in range(repeats):
        secs = one_repeat(lm, clean, corrupted, skip)
        base = secs.pop("floor")
        floors.append(base)
        for name, (w, c) in secs.items():
            ratios.setdefault(name, []).append((w / base[0], c / max(base[1], 1e-9)))
        shown = ", ".join(f"{k} {v[-1][1]:.2f}x" for k, v in ratios.items())
        log.warning("N=%d repeat %d: floor %.1f s wall / %.1f s CPU; CPU ratios %s", n, r + 1, *base, shown)
    med = {
        k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in ratios.items()
    }
    return {
        "n": n,
        "ratios": med,
        "floor": (statistics.median(f[0] for f in floors), statistics.median(f[1] for f in floors)),
    }


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def _cell(row: dict[str, Any], key: str) -> str:
    if key not in row["ratios"]:
        return "refused" if key in ("trace", "routes") else "not run"
    w, c = row["ratios"][key]
    if key in BUDGETS:  # three decimals: the mark must agree with the figure shown
        return f"{c:.3f}x ({w:.3f}x) {'✓' if c <= BUDGETS[key] else '✗'}"
    return f"{c:.2f}x ({w:.2f}x)"


HEADER = (
    "| N | blocks | floor: CPU s (wall s) | stream alone | trace (block_trace) | lens, 16 positions "
    "| DLA + mixer heads | routes | trace + every readout (≤ 1.3x) | patching setup (2 capture runs) "
    "| one residual patch | attribution patching (≤ 4x) |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def markdown_row(row: dict[str, Any], blocks: int) -> str:
    cells = " | ".join(_cell(row, k) for k in ROWS)
    return f"| {row['n']} | {blocks} | {row['floor'][1]:.1f} ({row['floor'][0]:.1f}) | {cells} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m attnviz.bench.hybrid_explain", description=(__doc__ or "").splitlines()[0]
    )
    ap.add_argument("--tokens", default="2048", help="comma-separated token counts")
    ap.add_argument("--blocks", type=int, default=BLOCKS, help="blocks of the 0.8B shape (default 24)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip", default="", help="rows not to run: patch, atp (comma-separated)")
    ap.add_argument("--out", type=Path, default=None, help="write the rows into this Markdown file")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if skip - {"patch", "atp"}:
        ap.error(f"--skip takes patch, atp; not {', '.join(sorted(skip - {'patch', 'atp'}))}")
    with _quiet("transformers", "attnviz.loading", "attnviz.mixers"):
        return _run(args, skip)


@contextmanager
def _quiet(*names: str) -> Iterator[None]:
    """These loggers at ERROR for the bench's run, then as they were: a caller in the same process
    (a test session, a notebook) keeps hearing them afterwards."""
    before = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for n, level in before.items():
            logging.getLogger(n).setLevel(level)


def _run(args: argparse.Namespace, skip: set[str]) -> int:
    lm = qwen35_08b(args.blocks)
    start = load()
    rows = [bench(lm, int(t), args.repeats, skip) for t in args.tokens.split(",") if t]
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"{when}; {machine_line(torch.device('cpu'))}; load average (1 / 5 / 15 min) {start} at the "
        f"start, {load()} at the end (a shared machine); medians of {args.repeats}; "
        f"`python -m attnviz.bench.hybrid_explain --tokens {args.tokens} --blocks {args.blocks} "
        f"--repeats {args.repeats}{f' --skip {args.skip}' if skip else ''}`. Each cell: CPU-time ratio "
        "to the floor (wall-time ratio in brackets).",
        "",
        HEADER,
        *(markdown_row(r, args.blocks) for r in rows),
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    if args.out is not None:
        replace_section(args.out, f"hybrid-explain-{args.blocks}", "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
