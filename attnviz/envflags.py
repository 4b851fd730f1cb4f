"""Environment flags parsed one way, for every module (`attnviz.server.env` re-exports them).

A boolean flag is true for ``1/true/yes/on`` and false for ``0/false/no/off`` (any case, spaces
around ignored, unset or empty = the default); anything else raises `BadSetting` with the flag's
name and the accepted spellings, so a typo stops with a one-line message instead of being read as
"off". Integers likewise, with their range; text values (a folder, an address) are read stripped.
This module sits below `attnviz.loading` and `attnviz.server` (it imports only `attnviz.errors`),
so both read their flags here. The table of every flag is `attnviz.server.env`.
"""

from __future__ import annotations

import logging
import os

from .errors import AttnvizError

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})


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


def text(name: str, default: str = "") -> str:
    """A text environment setting (a folder, an address, a list), stripped; unset or empty = ``default``."""
    return _raw(name) or default


def log_level(default: str) -> str:
    """ATTNVIZ_LOG_LEVEL as a `logging` level name (any case), ``default`` when unset or unknown."""
    level = text("ATTNVIZ_LOG_LEVEL", default).upper()
    return level if level in logging.getLevelNamesMapping() else default
