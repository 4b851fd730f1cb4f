"""`attnviz` (or `python -m attnviz`): extract, info, bench, warmup, app, atlas.

Every argument is checked before a model loads, where it is parsed (the ``type=`` functions
below) or, for what needs the model's config (``--verify LAYER``), from the config alone
(`_preflight`): a bad one is one line on stderr and exit status 2; an engine error (AttnvizError)
is one line and status 1. ``ATTNVIZ_MAX_TOKENS`` sets ``--max-tokens``' default and
``ATTNVIZ_LOG_LEVEL`` the log level (WARNING), as in the app.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from pathlib import Path

from ._version import __version__
from .atlas import command as atlas_command
from .cli_args import (
    device_name,
    dtype_name,
    model_name,
    non_negative_int,
    port_number,
    positive_int,
    some_text,
    token_sizes,
    verify_layer,
    writable_file,
)
from .envflags import log_level, text
from .errors import AttnvizError
from .export import FORMATS
from .extract import DEFAULT_MAX_TOKENS
from .result import PATHS


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump, exit 2
        sys.stderr.write(f"attnviz: error: {message}\n")
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="attnviz", description="Look inside transformer attention.")
    p.add_argument("--version", action="version", version=f"attnviz {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def model_args(sp):
        sp.add_argument(
            "--model", required=True, type=model_name, help="built-in name, Hub id or local folder"
        )
        sp.add_argument(
            "--device", default="auto", type=device_name, help="auto (CUDA, MPS, CPU), cpu, cuda, cuda:1, mps"
        )
        sp.add_argument("--dtype", default="auto", type=dtype_name, help="auto, float32, bfloat16, float16")
        sp.add_argument("--revision", default=None)

    ex = sub.add_parser("extract", help="attention of a model on a text, saved as .npz")
    model_args(ex)
    ex.add_argument("--text", required=True, type=some_text)
    ex.add_argument("--out", required=True, type=writable_file, help="output .npz file")
    ex.add_argument(
        "--format",
        default="auto",
        choices=FORMATS,
        help="dense: every layer's (heads, N, N) probabilities; compact: the captured queries, keys "
        "and values, read back with attnviz.load_npz; auto (default): dense up to 256 MiB of "
        "probabilities (~500 tokens on smollm2-135m), compact past that",
    )
    ex.add_argument("--path", default="fast", choices=PATHS)
    ex.add_argument("--chat", action="store_true", help="wrap the text in the chat template")
    ex.add_argument(
        "--generate", type=non_negative_int, default=0, metavar="K", help="greedily generate K tokens"
    )
    ex.add_argument(
        "--max-tokens",
        type=positive_int,
        default=None,
        help=f"refuse longer texts (default: ATTNVIZ_MAX_TOKENS, else {DEFAULT_MAX_TOKENS})",
    )
    ex.add_argument(
        "--verify",
        nargs="?",
        const="true",
        default=None,
        type=verify_layer,
        metavar="LAYER",
        help="recompute one layer of every stack (the middle one, or LAYER) with transformers' eager "
        "attention and fail on a mismatch",
    )

    info = sub.add_parser("info", help="the attention layout of a model")
    model_args(info)

    bench = sub.add_parser("bench", help="fast path vs SDPA floor vs eager; writes docs/benchmarks.md")
    bench.add_argument(
        "--sizes", default="256,1024,2048,4096,8192", type=token_sizes, help="comma-separated token counts"
    )
    bench.add_argument("--repeats", type=positive_int, default=3)
    bench.add_argument("--out", type=writable_file, default=Path("docs/benchmarks.md"))
    bench.add_argument("--device", default="auto", type=device_name)
    bench.add_argument("--no-write", action="store_true", help="print only")
    bench.add_argument("--peaks-only", action="store_true", help=argparse.SUPPRESS)
    bench.add_argument("--stats-sizes", help="token counts of the statistics rows (default: --sizes)")
    bench.add_argument(
        "--llama-sizes",
        type=token_sizes,
        help="CUDA: token counts of the Llama-3.2-3B-shaped statistics rows",
    )
    bench.add_argument(
        "--no-stats", action="store_true", help="the extraction table only (no whole-model statistics rows)"
    )
    bench.add_argument(
        "--hybrid",
        type=token_sizes,
        help="only the hybrid rows (a Qwen3.5-shaped Gated DeltaNet model on the CPU) at these token counts",
    )
    bench.add_argument(
        "--hybrid-explain",
        type=token_sizes,
        help="only the explain rows of a Qwen3.5-0.8B-shaped hybrid on the CPU (stream, lens, DLA, "
        "patching, attribution patching against one forward) at these token counts",
    )
    bench.add_argument(
        "--hybrid-blocks", type=positive_int, default=24, help="--hybrid-explain: blocks of the 0.8B shape"
    )

    sub.add_parser("warmup", help="convert and cache the built-in models (for images and first start)")

    app = sub.add_parser("app", help="start the web app (Streamlit) from the installed package")
    app.add_argument("--port", type=port_number, default=8501)
    app.add_argument("--address", default="localhost", help="0.0.0.0 to serve other machines")
    app.add_argument("--browser", action="store_true", help="open a browser tab")

    atlas_command.add_parser(sub, model_args, positive_int, writable_file)  # see atlas/command.py
    return p


def _extract(args) -> int:
    from . import extract, load_model
    from .export import choose_format, dense_nbytes, save_npz
    from .loading.files import atomic_write

    lm = load_model(args.model, device=args.device, dtype=args.dtype, revision=args.revision)
    res = extract(
        lm,
        args.text,
        path=args.path,
        chat=args.chat,
        generate=args.generate,
        max_tokens=args.max_tokens,
        verify=False if args.verify is None else args.verify,
    )
    fmt = choose_format(res, args.format)
    saved: list[str] = []
    try:  # complete or absent: a full disk or a kill mid-write never leaves half an .npz
        atomic_write(
            args.out,
            lambda f: saved.append(save_npz(res, f, format=fmt)),
            what=repr(args.out.name),
            needed=dense_nbytes(res) if fmt == "dense" else res.nbytes,
            up_to=fmt == "dense",  # compressed: the raw arrays' size bounds the file
        )
    except OSError as err:
        raise AttnvizError(f"cannot write {str(args.out)!r}: {err.strerror or err}") from None
    n = len(res.tokens)
    if not res.layout.n_layers:  # Mamba, RWKV: the file holds the mixers alone
        what = (
            "the token mixers' kernel inputs; read it with attnviz.load_npz"
            if saved == ["compact"]
            else "each block's mixer matrix as mixer_<block>_<kind> (heads, N, N) and the mixers' "
            "kernel inputs (attnviz.load_npz)"
        )
        sys.stdout.write(
            f"wrote {args.out}: {n} tokens; {res.layout.model_type} has no softmax attention layer, "
            f"so there is no 'attentions' array: the file holds {what}\n"
        )
    else:
        how = (
            "compact: queries, keys and values; read it with attnviz.load_npz"
            if saved == ["compact"]
            else "dense"
        )
        shape = f"{res.n_layers()} layers x {res.n_heads} heads"
        sys.stdout.write(f"wrote {args.out}: {n} tokens, {shape} ({res.path}; {how})\n")
    if res.layout.mixer_summary():  # the file holds every mixer too (attnviz.load_npz)
        sys.stdout.write(f"token mixers: {res.layout.mixer_summary()}\n")
    if res.checks:  # one figure per stack (encoder, decoder, cross)
        sys.stdout.write(res.check_caption() + "\n")
    return 0


# Layers of the built-in models (their configs are on disk only after the first use).
BUILTIN_LAYERS = {"smollm2-135m": 30, "minilm-l6": 6}


def _config_layers(spec: str, revision: str | None) -> int | None:
    """The first stack's layer count from the model's config alone (no weights), or None where
    the config cannot be read cheaply (the range is then checked once the model has loaded)."""
    from transformers import AutoConfig

    from .loading import BUILTIN_MODELS, attention_layout, hub_reachable

    if spec in BUILTIN_MODELS:
        return BUILTIN_LAYERS.get(spec)
    folder = Path(spec).expanduser()
    try:
        if folder.is_dir():
            config = AutoConfig.from_pretrained(folder)
        else:
            token = os.environ.get("HF_TOKEN") or None
            config = AutoConfig.from_pretrained(
                spec, revision=revision, token=token, local_files_only=not hub_reachable()
            )
        layout = attention_layout(config)
    except Exception:  # noqa: BLE001 - the load reports it properly
        return None
    return layout.layers_in(layout.stacks[0])


def _preflight(args, error) -> None:
    """The checks that need more than one argument or the model's config, before it loads."""
    from .server.env import number

    if args.command != "extract":
        return
    if args.max_tokens is None:
        try:
            args.max_tokens = number("ATTNVIZ_MAX_TOKENS", DEFAULT_MAX_TOKENS)
        except AttnvizError as err:
            error(str(err))
    if isinstance(args.verify, int):
        n = _config_layers(args.model, args.revision)
        if n is not None and args.verify >= n:
            error(
                f"argument --verify: layer {args.verify} is out of range; {args.model} has layers 0..{n - 1}"
            )


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
            "no softmax attention: one forward captures the token mixers' kernel inputs"
            if not lay.n_layers
            else "fast exact (SDPA + captured Q/K/V)"
            if lm.fast_exact
            else "eager exact, one layer at a time"
            + (f" ({lm.probe.why_not_fast})" if lm.probe and lm.probe.why_not_fast else ""),
        ),
    ]
    if lay.sliding_window:
        rows.append(("sliding window", str(lay.sliding_window)))
    if lay.layer_types:
        kinds = sorted(set(lay.layer_types))
        rows.append(("layer types", ", ".join(f"{k} x{lay.layer_types.count(k)}" for k in kinds)))
    if lay.softcap:
        rows.append(("logit soft-cap", str(lay.softcap)))
    if lay.mixer_summary():  # hybrids and recurrent models (attnviz.mixers)
        rows.append(("token mixers", lay.mixer_summary()))
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


def _app(args) -> int:
    """`streamlit run` on the app shipped in the package (attnviz/_app in a wheel, the checkout's
    app.py in an editable install), with the shipped .streamlit/config.toml as flags (Streamlit
    reads config files only from the working folder and the home folder)."""
    from .server.app_files import app_script, streamlit_flags
    from .server.healthcheck import STATUS_FILE_ENV

    if importlib.util.find_spec("streamlit") is None:
        raise AttnvizError(
            'the web app needs Streamlit: pip install "streamlit>=1.45,<2" '
            '(in a checkout: pip install ".[app]")'
        )
    script = app_script()
    status = text(STATUS_FILE_ENV)
    if status:  # a previous server's queue status would read as a stuck queue until a visitor came
        Path(status).unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "streamlit", "run", str(script), *streamlit_flags(script.parent)]
    cmd += [f"--server.port={args.port}", f"--server.address={args.address}"]
    cmd += [f"--server.headless={'false' if args.browser else 'true'}", "--global.developmentMode=false"]
    sys.stderr.write(f"attnviz: serving {script} on http://{args.address}:{args.port}\n")
    sys.stderr.flush()
    # Become the server (no child process): signals such as `docker stop`'s SIGTERM reach it.
    os.execv(sys.executable, cmd)
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=log_level("WARNING"), format="%(levelname)s %(name)s: %(message)s")
    parser = _parser()
    args = parser.parse_args(argv)
    _preflight(args, parser.error)
    try:
        if args.command == "atlas":
            return atlas_command.main(args, parser.error)
        if args.command == "extract":
            return _extract(args)
        if args.command == "info":
            return _info(args)
        if args.command == "warmup":
            return _warmup(args)
        if args.command == "app":
            return _app(args)
        if getattr(args, "hybrid_explain", None):
            from .bench.hybrid_explain import main as hybrid_explain_bench

            out = [] if args.no_write else ["--out", str(args.out)]
            sizes = ["--tokens", str(args.hybrid_explain), "--blocks", str(args.hybrid_blocks)]
            return hybrid_explain_bench([*sizes, "--repeats", str(args.repeats), *out])
        if getattr(args, "hybrid", None):
            from .bench.hybrid import main as hybrid_bench

            out = [] if args.no_write else ["--out", str(args.out)]
            return hybrid_bench(["--tokens", str(args.hybrid), "--repeats", str(args.repeats), *out])
        from .bench.extraction import run_bench

        return run_bench(args)
    except AttnvizError as err:
        sys.stderr.write(f"attnviz: error: {err}\n")
        return 1
    except KeyboardInterrupt:
        return 130
