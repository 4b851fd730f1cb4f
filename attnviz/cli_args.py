"""The command line's argument types: each checks one argument as it is parsed, before any model
loads, and says what is wrong in one line (argparse turns it into exit status 2)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from .errors import AttnvizError
from .extract import DEFAULT_MAX_TOKENS


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{text!r} must be {low} or more")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def token_sizes(text: str) -> str:
    """ "256, 1024" -> "256,1024": comma-separated token counts, each 1 or more."""
    parts = [s.strip() for s in text.split(",") if s.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("give comma-separated token counts, e.g. 256,1024")
    try:
        return ",".join(str(positive_int(s)) for s in parts)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err}; give comma-separated token counts") from None


def dtype_name(text: str) -> str:
    import torch

    from .errors import AttnvizError
    from .loading import resolve_dtype

    try:
        resolve_dtype(text, torch.device("cpu"))
    except AttnvizError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def model_name(text: str) -> str:
    """A built-in name, a Hub id or an existing local folder, by the rules a server applies
    (`attnviz.server.specs.resolve`, local folders allowed): no file is read, nothing loads."""
    from .server.settings import Settings
    from .server.specs import resolve

    try:
        spec = resolve(text, Settings(demo=False, allowed_models=(), max_tokens=DEFAULT_MAX_TOKENS))
    except AttnvizError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if spec.source == "local" and not Path(spec.spec).expanduser().is_dir():
        raise argparse.ArgumentTypeError(f"local folder {spec.spec!r} does not exist (or is not a folder)")
    return spec.spec


VERIFY_MIDDLE = ("true", "yes", "on", "auto")


def verify_layer(text: str) -> str | int:
    """``--verify`` with no value (the middle layer), ``auto`` or a layer index 0, 1, ..."""
    if text.strip().lower() in VERIFY_MIDDLE:
        return text.strip().lower()
    try:
        return _int_at_least(text, 0)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a layer; give a layer index (0, 1, ...) or no value for the middle layer"
        ) from None


def some_text(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the text is empty; give some words")
    return text


def device_name(text: str) -> str:
    """A device that exists here (the engine's rule: a missing device is an error, no fallback)."""
    from .errors import AttnvizError
    from .loading import resolve_device

    try:
        resolve_device(text)
    except AttnvizError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def writable_file(text: str) -> Path:
    """An output file whose folder exists (or can be made) and can be written to, checked before
    the model loads. Probed by creating a temporary file, so it also holds for root."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file name")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: {str(folder)!r} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: {str(folder)!r}: {reason}") from None
    return path


def port_number(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (1..65535)")
    return value
