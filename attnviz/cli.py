"""`python -m attnviz`: extract, info, bench, warmup. Bad arguments: one line, non-zero exit."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

from .errors import AttnvizError
from .extract import DEFAULT_MAX_TOKENS, PATHS


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump, exit 2
        sys.stderr.write(f"attnviz: error: {message}\n")
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m attnviz", description="Look inside transformer attention.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def model_args(sp):
        sp.add_argument("--model", required=True, help="built-in name, Hub id or local folder")
        sp.add_argument("--device", default="auto", help="auto (CUDA, MPS, CPU), cpu, cuda, cuda:1, mps")
        sp.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
        sp.add_argument("--revision", default=None)

    ex = sub.add_parser("extract", help="attention of a model on a text, saved as .npz")
    model_args(ex)
    ex.add_argument("--text", required=True)
    ex.add_argument("--out", required=True, type=Path, help="output .npz file")
    ex.add_argument("--path", default="fast", choices=PATHS)
    ex.add_argument("--chat", action="store_true", help="wrap the text in the chat template")
    ex.add_argument("--generate", type=int, default=0, metavar="K", help="greedily generate K tokens")
    ex.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)

    info = sub.add_parser("info", help="the attention layout of a model")
    model_args(info)

    bench = sub.add_parser("bench", help="fast path vs SDPA floor vs eager; writes docs/benchmarks.md")
    bench.add_argument("--sizes", default="256,1024,2048,4096,8192", help="comma-separated token counts")
    bench.add_argument("--repeats", type=int, default=3)
    bench.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"))
    bench.add_argument("--device", default="auto")
    bench.add_argument("--no-write", action="store_true", help="print only")
    bench.add_argument("--peaks-only", action="store_true", help=argparse.SUPPRESS)
    bench.add_argument("--stats-sizes", help="token counts of the statistics rows (default: --sizes)")

    sub.add_parser("warmup", help="convert and cache the built-in models (for images and first start)")
    return p


def _extract(args) -> int:
    from . import extract, load_model

    if args.generate < 0:
        raise AttnvizError("--generate must be 0 or more")
    lm = load_model(args.model, device=args.device, dtype=args.dtype, revision=args.revision)
    res = extract(
        lm, args.text, path=args.path, chat=args.chat, generate=args.generate, max_tokens=args.max_tokens
    )
    arrays: dict[str, np.ndarray] = {
        "tokens": np.array(res.tokens.display, dtype=str),
        "raw_tokens": np.array(res.tokens.raw, dtype=str),
        "input_ids": np.array(res.tokens.ids, dtype=np.int64),
        "special": np.array(res.tokens.special, dtype=bool),
    }
    if lm.layout.kind == "encoder-decoder":
        assert res.decoder_tokens is not None
        arrays["decoder_tokens"] = np.array(res.decoder_tokens.display, dtype=str)
        arrays["decoder_input_ids"] = np.array(res.decoder_tokens.ids, dtype=np.int64)
        for stack in ("encoder", "decoder", "cross"):
            arrays[f"{stack}_attentions"] = res.all_layers(stack)  # type: ignore[arg-type]
    else:
        arrays["attentions"] = res.all_layers()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)  # type: ignore[arg-type]
    n = len(res.tokens)
    sys.stdout.write(
        f"wrote {args.out}: {n} tokens, {res.n_layers()} layers x {res.n_heads} heads ({res.path})\n"
    )
    return 0


def _info(args) -> int:
    from . import load_model

    lm = load_model(args.model, device=args.device, dtype=args.dtype, revision=args.revision)
    lay = lm.layout
    rows = [
        ("model", lm.spec),
        ("type", f"{lay.model_type} ({lay.kind})"),
        (
            "layers",
            str(lay.n_layers)
            + (f" encoder + {lay.n_decoder_layers} decoder" if lay.n_decoder_layers else ""),
        ),
        ("query heads", str(lay.n_heads)),
        (
            "kv heads",
            f"{lay.n_kv_heads}"
            + (f" (GQA, {lay.group_size} query heads each)" if lay.group_size > 1 else ""),
        ),
        ("head_dim", str(lay.head_dim)),
        ("d_model", str(lay.d_model)),
        ("device / dtype", f"{lm.device} / {str(lm.dtype).removeprefix('torch.')}"),
        (
            "fast path",
            "capture (SDPA + Q/K)"
            if lm.supports_capture
            else "eager (model does not use AttentionInterface)",
        ),
    ]
    if lay.sliding_window:
        rows.append(("sliding window", str(lay.sliding_window)))
    if lay.layer_types:
        kinds = sorted(set(lay.layer_types))
        rows.append(("layer types", ", ".join(f"{k} x{lay.layer_types.count(k)}" for k in kinds)))
    if lay.softcap:
        rows.append(("logit soft-cap", str(lay.softcap)))
    width = max(len(k) for k, _ in rows)
    sys.stdout.write("".join(f"{k:<{width}}  {v}\n" for k, v in rows))
    return 0


def _warmup(args) -> int:
    from . import BUILTIN_MODELS, extract, load_model

    for spec in BUILTIN_MODELS:
        lm = load_model(spec, device="cpu")
        extract(lm, "warm up")
        sys.stdout.write(f"ready: {spec}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    try:
        if args.command == "extract":
            return _extract(args)
        if args.command == "info":
            return _info(args)
        if args.command == "warmup":
            return _warmup(args)
        from .bench import run_bench

        return run_bench(args)
    except AttnvizError as err:
        sys.stderr.write(f"attnviz: error: {err}\n")
        return 1
    except KeyboardInterrupt:
        return 130
