"""Server log: attnviz's INFO lines (loads, extractions with model, tokens, path, seconds) on
stderr, configured once per process. Never the token: the engine logs model names only and the
UI scrubs the token from unexpected errors before logging them."""

from __future__ import annotations

import logging
import sys

from attnviz.server import env

_MARK = "_attnviz_ui_handler"


def configure() -> None:
    """Attach one stderr handler to the ``attnviz`` logger (level from ATTNVIZ_LOG_LEVEL, INFO)."""
    logger = logging.getLogger("attnviz")
    if any(getattr(h, _MARK, False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    setattr(handler, _MARK, True)
    logger.addHandler(handler)
    logger.setLevel(env.log_level("INFO"))
