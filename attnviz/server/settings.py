"""Server-side settings from environment variables (never from user input).

Boolean flags read 1/true/yes/on or 0/false/no/off (any case); anything else stops the server
with a one-line message (`attnviz.server.env`).

ATTNVIZ_DEMO=1                public demo: model allow-list, token cap, no local paths, no token field,
                              one inference at a time with a visible queue
ATTNVIZ_ALLOWED_MODELS=a,b    demo allow-list (default: the built-in models)
ATTNVIZ_MAX_TOKENS=N          token cap (default 8192, demo 512)
ATTNVIZ_QUEUE_MAX=N           demo: requests that may wait at once (default 16; 0 = no cap)
ATTNVIZ_RUN_LIMIT_S=N         demo: seconds one run may take before it is stopped (default 120)
ATTNVIZ_STATUS_FILE=PATH      demo: the queue's status as JSON, rewritten every 5 s, for the health
                              check (`attnviz.server.healthcheck`; the Docker image sets it)
ATTNVIZ_CACHE=DIR             converted built-in models (default ~/.cache/attnviz)
ATTNVIZ_ALLOW_PICKLE=1        allow non-safetensors weights (default: refused)
ATTNVIZ_TRUST_REMOTE_CODE=1   allow models with custom code (default: refused)
HF_TOKEN                      token for gated Hub models (server-wide)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..loading import BUILTIN_MODELS
from .env import flag, integer
from .healthcheck import STATUS_FILE_ENV

DEMO_MAX_TOKENS = 512
FULL_MAX_TOKENS = 8192
DEMO_QUEUE_MAX = 16
DEMO_RUN_LIMIT_S = 120
DEMO_ATLAS_TEXTS = 24  # the Head atlas's corpus in the demo: its first texts, no uploads


@dataclass(frozen=True)
class Settings:
    demo: bool
    allowed_models: tuple[str, ...]  # empty = any model
    max_tokens: int
    queue_max: int = 0  # demo: requests that may wait at once (0 = no cap)
    run_limit: float | None = None  # demo: seconds per run
    status_file: str = ""  # demo: where the queue's watchdog writes its status ("" = nowhere)

    @property
    def allow_local_paths(self) -> bool:
        return not self.demo

    @property
    def allow_token_field(self) -> bool:
        return not self.demo

    @property
    def model_choices(self) -> tuple[str, ...]:
        """Models offered in the picker: the built-ins first, then the allow-list."""
        extra = tuple(m for m in self.allowed_models if m not in BUILTIN_MODELS)
        return (*BUILTIN_MODELS, *extra) if not self.demo else tuple(self.allowed_models)


def settings() -> Settings:
    """Read the settings now (cheap; re-read so tests and restarts see changes)."""
    demo = flag("ATTNVIZ_DEMO")
    allowed = tuple(m.strip() for m in os.environ.get("ATTNVIZ_ALLOWED_MODELS", "").split(",") if m.strip())
    if demo and not allowed:
        allowed = tuple(BUILTIN_MODELS)
    default_cap = DEMO_MAX_TOKENS if demo else FULL_MAX_TOKENS
    cap = integer("ATTNVIZ_MAX_TOKENS", default_cap, lo=1, hi=1_000_000)
    queue = integer("ATTNVIZ_QUEUE_MAX", DEMO_QUEUE_MAX, lo=0, hi=10_000)
    limit = integer("ATTNVIZ_RUN_LIMIT_S", DEMO_RUN_LIMIT_S, lo=1, hi=86_400)
    if not demo:
        return Settings(demo=demo, allowed_models=allowed, max_tokens=cap)
    return Settings(
        demo=demo,
        allowed_models=allowed,
        max_tokens=cap,
        queue_max=queue,
        run_limit=float(limit),
        status_file=os.environ.get(STATUS_FILE_ENV, "").strip(),
    )
