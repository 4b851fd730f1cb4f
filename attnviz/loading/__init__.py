"""Loading models for `extract`, in three rooms:

- `load`: resolve a name (built-in, Hub id, local folder) and load it, with errors that say what to do;
- `config`: read the attention layout from a config and pick the Auto class;
- `forward`: the one front door to run a model (`LoadedModel.forward`: lock, inference mode,
  kwargs, logits only where asked, this thread's hooks);
- `model`: `LoadedModel` and preparing a built model (attention implementation, attention layers);
- `device`: device and dtype choice;
- `names`: what a model name may be (built-ins, Hub ids, folders);
- `builtins`: fetching the built-in models' packages;
- `convert`: the built-in SmolLM2 converted from its GGUF into a verified cache entry;
- `files`: safe writes for everything attnviz writes (atomic files, manifests, locks, disk-full
  and read-only messages).

Every public name stays importable from ``attnviz.loading``.
"""

from .config import attention_layout, auto_class, model_kind
from .device import is_out_of_memory, resolve_device, resolve_dtype
from .forward import Hook, LogitsAt
from .load import (
    builtin_folder,
    builtin_source,
    cache_dir,
    hub_reachable,
    load_model,
    load_source,
    needs_conversion,
    trust_remote_code,
)
from .model import LoadedModel, wrap_model
from .names import BUILTIN_MODELS, DEFAULT_MODEL, check_id, classify_spec

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "Hook",
    "LoadedModel",
    "LogitsAt",
    "attention_layout",
    "auto_class",
    "builtin_folder",
    "builtin_source",
    "cache_dir",
    "check_id",
    "classify_spec",
    "hub_reachable",
    "is_out_of_memory",
    "load_model",
    "load_source",
    "model_kind",
    "needs_conversion",
    "resolve_device",
    "resolve_dtype",
    "trust_remote_code",
    "wrap_model",
]
