"""Loading models for `extract`, in three rooms:

- `load`: resolve a name (built-in, Hub id, local folder) and load it, with errors that say what to do;
- `config`: read the attention layout from a config and pick the Auto class;
- `model`: `LoadedModel` and preparing a built model (attention implementation, attention layers);
- `device`: device and dtype choice;
- `convert`: the built-in SmolLM2 converted from its GGUF into a verified cache entry;
- `files`: safe writes for everything attnviz writes (atomic files, manifests, locks, disk-full
  and read-only messages).

Every public name stays importable from ``attnviz.loading``.
"""

from .config import _auto_class, _first, _text_config, attention_layout, model_kind
from .device import is_out_of_memory, resolve_device, resolve_dtype
from .load import (
    _MINILM_PACKAGE,
    _SMOLLM_GGUF,
    _SMOLLM_PACKAGE,
    BUILTIN_MODELS,
    DEFAULT_MODEL,
    _hub_error,
    _package_folder,
    builtin_folder,
    builtin_source,
    cache_dir,
    classify_spec,
    hub_reachable,
    load_model,
    needs_conversion,
    trust_remote_code,
)
from .model import LoadedModel, _input_device, _use_capture, wrap_model

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "_MINILM_PACKAGE",
    "_SMOLLM_GGUF",
    "_SMOLLM_PACKAGE",
    "LoadedModel",
    "_auto_class",
    "_first",
    "_hub_error",
    "_input_device",
    "_package_folder",
    "_text_config",
    "_use_capture",
    "attention_layout",
    "builtin_folder",
    "builtin_source",
    "cache_dir",
    "classify_spec",
    "hub_reachable",
    "is_out_of_memory",
    "load_model",
    "model_kind",
    "needs_conversion",
    "resolve_device",
    "resolve_dtype",
    "trust_remote_code",
    "wrap_model",
]
