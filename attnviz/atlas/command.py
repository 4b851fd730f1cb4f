"""``attnviz atlas``: rank every head of a model over a corpus file, locally or on Ray.

    attnviz atlas --model smollm2-135m --corpus texts.jsonl --out atlas.parquet
    attnviz atlas --model M --corpus texts.txt --out atlas.csv --engine ray --workers 4

Writes three tables next to each other: OUT (one row per head: each statistic's mean, max and
example snippet, as the atlas page shows), OUT's stem + ``.texts`` (one row per text x head) and
+ ``.skipped`` (texts that failed, with the reason). Every argument is checked before a model
loads (one line, exit status 2). Finished texts are in the disk cache: after Ctrl-C or a crash the
same command resumes where it stopped.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from ..errors import AttnvizError
from .corpus import check_corpus_path
from .ranking import Atlas
from .run import ATLAS_MAX_TOKENS, ENGINES, AtlasInterrupted, run_atlas

OUT_SUFFIXES = (".csv", ".parquet")


def corpus_file(text: str) -> Path:
    path = Path(text).expanduser()
    try:
        check_corpus_path(path)
    except AttnvizError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return path


def add_parser(sub: Any, model_args: Callable, positive_int: Callable, writable_file: Callable) -> None:
    """Register ``atlas`` on the ``attnviz`` subcommands (the helpers are the CLI's own checks)."""

    def out_file(text: str) -> Path:
        path = writable_file(text)  # a folder, or no write permission: said first
        if path.suffix.lower() not in OUT_SUFFIXES:
            raise argparse.ArgumentTypeError(f"{text!r}: write a .csv or .parquet file")
        if importlib.util.find_spec("pandas") is None:
            raise argparse.ArgumentTypeError("writing the atlas tables needs pandas (pip install pandas)")
        if text.lower().endswith(".parquet") and importlib.util.find_spec("pyarrow") is None:
            raise argparse.ArgumentTypeError(
                "writing .parquet needs pyarrow (pip install pyarrow); or use .csv"
            )
        return path

    at = sub.add_parser(
        "atlas", help="rank every head over a corpus (.txt/.jsonl/.parquet), locally or on Ray"
    )
    model_args(at)
    at.add_argument(
        "--corpus", required=True, type=corpus_file, help=".txt (a text a line), .jsonl, .parquet"
    )
    at.add_argument(
        "--out", required=True, type=out_file, help="atlas.csv or atlas.parquet (+ .texts, .skipped)"
    )
    at.add_argument("--engine", default="local", choices=ENGINES)
    at.add_argument(
        "--ray-address", default=None, help="a Ray cluster (host:6379); default: start a local Ray"
    )
    at.add_argument(
        "--workers", type=positive_int, default=None, help="Ray workers (default: one per GPU, or 1)"
    )
    at.add_argument(
        "--max-tokens", type=positive_int, default=ATLAS_MAX_TOKENS, help="longer texts are skipped"
    )
    at.add_argument("--fresh", action="store_true", help="recompute every text (ignore the disk cache)")
    at.add_argument(
        "--cache", type=Path, default=None, help="the atlas cache folder (default: ~/.cache/attnviz/atlas)"
    )


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with a combination of arguments (None: nothing), before anything loads."""
    if args.engine == "local" and args.workers not in (None, 1):
        return "argument --workers: the local engine runs one worker; add --engine ray for more"
    if args.engine == "local" and args.ray_address:
        return "argument --ray-address: add --engine ray to use a Ray cluster"
    if args.engine == "ray" and importlib.util.find_spec("ray") is None:
        return 'argument --engine: the Ray engine needs Ray: pip install "attnviz[ray]"'
    return None


class TerminalProgress:
    """``[#####.....] 120/1000 texts · 3.2 texts/s · 4m35s left``: redrawn in place on a terminal,
    a line every ``every`` seconds elsewhere (logs, CI)."""

    def __init__(self, stream: TextIO | None = None, every: float = 10.0, width: int = 24):
        self.stream, self.every, self.width = stream or sys.stderr, every, width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0: float | None = None
        self.start_done = 0
        self.last = -1e9
        self.done = self.total = 0

    def line(self, done: int, total: int, now: float) -> str:
        bar = "#" * round(self.width * done / max(total, 1))
        text = f"[{bar:.<{self.width}}] {done}/{total} texts"
        ran, spent = done - self.start_done, now - (self.t0 or now)
        if ran > 0 and spent > 0:
            rate = ran / spent
            text += f" · {rate:.2f} texts/s · {_duration((total - done) / rate)} left"
        return text

    def __call__(self, done: int, total: int, note: str) -> bool:
        now = time.perf_counter()
        if self.t0 is None:
            self.t0, self.start_done = now, done
        self.done, self.total = done, total
        final = done >= total
        if self.tty:
            self.stream.write("\r" + self.line(done, total, now) + ("\n" if final else ""))
        elif final or now - self.last >= self.every:
            self.stream.write(self.line(done, total, now) + "\n")
            self.last = now
        self.stream.flush()
        return True


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def outputs(out: Path) -> tuple[Path, Path, Path]:
    """OUT, OUT's stem + .texts, + .skipped (same suffix)."""
    return (
        out,
        out.with_name(f"{out.stem}.texts{out.suffix}"),
        out.with_name(f"{out.stem}.skipped{out.suffix}"),
    )


def write_tables(atlas: Atlas, out: Path) -> tuple[Path, Path, Path]:
    import pandas as pd

    from ..loading.files import atomic_write_bytes

    heads, per_text, skipped = outputs(out)
    gone = pd.DataFrame(
        {"text_index": [i for i, _ in atlas.skipped], "reason": [r for _, r in atlas.skipped]}
    )
    try:  # each table complete or absent (a full or read-only disk: CannotWrite, one line)
        for frame, path in ((atlas.to_frame(), heads), (atlas.texts_frame(), per_text), (gone, skipped)):
            if path.suffix.lower() == ".parquet":
                data: bytes = frame.to_parquet(index=False)
            else:
                data = frame.to_csv(index=False).encode("utf-8")
            atomic_write_bytes(path, data)
    except OSError as err:
        raise AttnvizError(f"cannot write {str(out)!r}: {err.strerror or err}") from None
    return heads, per_text, skipped


def main(args: argparse.Namespace, error: Callable[[str], Any]) -> int:
    """Run ``attnviz atlas``; ``error`` is the parser's (one line, exit 2)."""
    problem = check(args)
    if problem:
        error(problem)
    bar = TerminalProgress()
    try:
        atlas = run_atlas(
            args.model, args.corpus, engine=args.engine, workers=args.workers, ray_address=args.ray_address,
            device=args.device, dtype=args.dtype, revision=args.revision, progress=bar,
            max_tokens=args.max_tokens, fresh=args.fresh, cache_root=args.cache,
        )  # fmt: skip
    except AtlasInterrupted as stop:
        where = f"saved in {stop.folder}" if stop.folder else "not saved (no disk cache)"
        sys.stderr.write(
            f"\nattnviz: interrupted after {stop.done} of {stop.total} texts ({where}); "
            "run the same command again to resume\n"
        )
        return 130
    except KeyboardInterrupt:  # before the run started (loading the model, starting Ray)
        sys.stderr.write("\nattnviz: interrupted before any text ran\n")
        return 130
    if atlas.cache_error:
        sys.stderr.write(f"attnviz: warning: {atlas.cache_error}\n")
    if not atlas.n_texts:
        first = f"; text {atlas.skipped[0][0]}: {atlas.skipped[0][1]}" if atlas.skipped else ""
        raise AttnvizError(f"no text of the corpus ran ({len(atlas.skipped)} failed{first})")
    heads, per_text, skipped = write_tables(atlas, args.out)
    n_l, n_h = atlas.shape
    sys.stdout.write(
        f"wrote {heads} ({n_l * n_h} heads), {per_text.name}, {skipped.name}: {atlas.n_texts} texts ran, "
        f"{len(atlas.skipped)} skipped; {atlas.computed} computed, {atlas.reused} from the cache; "
        f"{atlas.seconds:.1f} s, {atlas.engine} engine x{atlas.workers}\n"
    )
    return 0
