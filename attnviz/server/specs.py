"""Which models a server may load, and how a model name becomes a model: the rules the app asks.

A *spec* is what a user types: a built-in name (``smollm2-135m``), a Hugging Face Hub id
(``owner/name``), a local folder, or a name under a registered prefix (the test suite registers
``tiny:`` for its tiny random models through `register`; nothing here knows about tests).

`resolve` checks a spec against the server's `Settings` and says where it comes from, without
touching the filesystem when the server serves no local paths (so an error never reveals which
folders exist). `load` turns a resolved spec into a `LoadedModel`. Every refusal is an
`AttnvizError` whose one-line message says what to do.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..errors import ModelNotFound, NotAllowed
from ..inputs import token_limit
from ..loading.load import load_source, needs_conversion
from ..loading.model import LoadedModel
from ..loading.names import BUILTIN_MODELS, check_hub_chars, check_id, classify_spec
from .settings import Settings, settings

Source = Literal["builtin", "hub", "local", "plugin"]
SOURCE_LABELS: dict[str, str] = {
    "builtin": "built-in, offline",
    "hub": "Hugging Face Hub",
    "local": "local folder",
}


@dataclass(frozen=True)
class Plugin:
    """Models served under ``<prefix>:<name>``: ``load(name)`` builds one; ``label`` names the
    source in the app ("tiny test model")."""

    prefix: str
    load: Callable[[str], LoadedModel]
    label: str


_PLUGINS: dict[str, Plugin] = {}


def register(prefix: str, load: Callable[[str], LoadedModel], label: str) -> None:
    """Serve ``<prefix>:<name>`` specs with ``load(name)`` (an engine hook for plugins and the test
    suite; registering the same prefix again replaces it)."""
    if not re.fullmatch(r"[a-z][a-z0-9_-]*", prefix):
        raise ValueError(f"plugin prefix {prefix!r}: use lowercase letters, digits, '-' or '_'")
    _PLUGINS[prefix] = Plugin(prefix, load, label)


def unregister(prefix: str) -> None:
    _PLUGINS.pop(prefix, None)


def _plugin(spec: str) -> tuple[Plugin, str] | None:
    prefix, sep, name = spec.partition(":")
    if sep and prefix in _PLUGINS:
        return _PLUGINS[prefix], name
    return None


@dataclass(frozen=True)
class ModelSpec:
    """A spec this server may load: where it comes from and what loading it involves."""

    spec: str
    source: Source
    label: str  # where it comes from, for people ("built-in, offline", "Hugging Face Hub", ...)
    needs_conversion: bool = False  # a built-in converted once on first use (a slow first load)


def resolve(spec: str, cfg: Settings | None = None) -> ModelSpec:
    """Check ``spec`` against this server's rules and say where it comes from."""
    cfg = cfg or settings()
    spec = (spec or "").strip()
    if cfg.demo and spec not in cfg.allowed_models:
        raise NotAllowed(
            f"this public demo only serves {', '.join(cfg.allowed_models)}; "
            "run attnviz yourself (make run) to explore other models"
        )
    found = _plugin(spec)
    if found is not None:
        return ModelSpec(spec, "plugin", found[0].label)
    if spec in BUILTIN_MODELS:
        return ModelSpec(spec, "builtin", SOURCE_LABELS["builtin"], needs_conversion(spec))
    check_id(spec, allow_local=cfg.allow_local_paths)
    source: Source = "hub"
    if cfg.allow_local_paths:
        try:
            kind = classify_spec(spec)  # may look at the filesystem: only where paths are served
        except ModelNotFound:
            check_hub_chars(spec)  # say which characters, where that is the reason
            raise
        source = "local" if kind == "local" else "hub"
    return ModelSpec(spec, source, SOURCE_LABELS[source])


def load(ms: ModelSpec, token: str | None = None, cfg: Settings | None = None) -> LoadedModel:
    """Load a resolved spec (a plugin's model, or `attnviz.loading.load_source`: it is not classified
    again)."""
    cfg = cfg or settings()
    if ms.source == "plugin":
        found = _plugin(ms.spec)
        if found is None:
            raise ModelNotFound(f"{ms.spec!r}: no such model source on this server; pick a built-in model")
        return found[0].load(found[1])
    if ms.source == "local" and not cfg.allow_local_paths:  # a ModelSpec made by hand, not by resolve
        raise NotAllowed("local paths are not allowed on this server; pick a model from the list")
    return load_source(ms.spec, ms.source, token=token or None)


def token_cap(lm: LoadedModel, cfg: Settings | None = None) -> int:
    """The most tokens this server extracts with ``lm``: `attnviz.inputs.token_limit` under the
    configured cap (demo 512, default 8192, ``ATTNVIZ_MAX_TOKENS``): the smallest of the cap, the
    model's position table and what the device's free memory holds."""
    cfg = cfg or settings()
    return token_limit(lm, max_tokens=cfg.max_tokens)[0]
