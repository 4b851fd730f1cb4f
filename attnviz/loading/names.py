"""What a model name may be: a built-in, a Hugging Face Hub id, or a local folder - the one rule
(and the one set of messages) the loader, the server's allow-list and the app's links all use."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from ..errors import ModelNotFound, NotAllowed

Source = Literal["builtin", "local", "hub"]

BUILTIN_MODELS: dict[str, str] = {
    "smollm2-135m": "SmolLM2-135M-Instruct (Llama architecture, 30 layers x 9 heads, 3 KV heads)",
    "minilm-l6": "all-MiniLM-L6-v2 (BERT encoder, 6 layers x 12 heads)",
}
DEFAULT_MODEL = "smollm2-135m"
MAX_HUB_ID = 96 + 1 + 96  # owner (<= 96) / name (<= 96), the Hub's own limits
MAX_PATH = 1024
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9._-]{1,96})?")
HUB_CHAR = re.compile(r"[A-Za-z0-9._/-]")
PATH_PREFIXES = ("/", "./", "../", "~", "\\", "file:")


def looks_like_path(spec: str) -> bool:
    """A local folder, by its form alone (no filesystem look-up)."""
    return spec.startswith(PATH_PREFIXES) or "\\" in spec or spec.count("/") > 1


def is_hub_id(spec: str) -> bool:
    """``owner/name`` or ``name`` as the Hub spells them."""
    return HUB_ID.fullmatch(spec) is not None and ".." not in spec


def check_id(spec: str, *, allow_local: bool) -> None:
    """Raise with a specific message when ``spec`` cannot be a model name: empty, too long,
    control characters, a path where no paths are served, characters a Hub id never has.
    Never looks at the filesystem."""
    if not spec:
        raise ModelNotFound("no model given; pick a built-in model: " + ", ".join(BUILTIN_MODELS))
    if any(ord(c) < 32 or ord(c) == 127 for c in spec):
        raise ModelNotFound("the model name has control characters (a line break?); type it on one line")
    if looks_like_path(spec):
        if not allow_local:
            raise NotAllowed("local paths are not allowed on this server; pick a model from the list")
        if len(spec) > MAX_PATH:
            raise ModelNotFound(f"the folder path is {len(spec)} characters long; at most {MAX_PATH}")
        return
    if len(spec) > MAX_HUB_ID:
        raise ModelNotFound(
            f"the model name is {len(spec)} characters long; a Hub id is at most {MAX_HUB_ID} "
            "(owner/name, like 'gpt2' or 'Qwen/Qwen2.5-0.5B')"
        )
    if not allow_local:
        check_hub_chars(spec)


def check_hub_chars(spec: str) -> None:
    """Raise naming the characters a Hub id never has, when ``spec`` has any."""
    bad = sorted({c for c in spec if not HUB_CHAR.match(c)})
    if bad:
        shown = " ".join(repr(c) for c in bad[:8])
        raise ModelNotFound(
            f"{spec!r} is not a built-in model, a Hub id or a local folder: a Hub id has only "
            f"letters, digits, '-', '_', '.' and one '/', and this name also has {shown}"
        )


def classify_spec(spec: str) -> Source:
    """ "builtin", "local" or "hub" (raises ModelNotFound for a malformed name). A path by its
    start (``/``, ``./``, ``~``, ...) or an existing folder is local; a name with several '/'
    that is neither (a URL) is refused as no name at all, not as a missing folder. The one call
    here that looks at the filesystem."""
    s = spec.strip()
    if s in BUILTIN_MODELS:
        return "builtin"
    if s.startswith(PATH_PREFIXES) or "\\" in s or Path(s).expanduser().exists():
        return "local"
    if is_hub_id(s):
        return "hub"
    raise ModelNotFound(
        f"{spec!r} is not a built-in model, a Hub id (like 'gpt2' or 'meta-llama/Llama-3.2-3B-Instruct') "
        "or an existing local folder"
    )
