"""The kernel path of transformers' hybrids, on CPU: the stand-in packages of
tests/kernel_standins (``fla``, ``mamba_ssm``, ``causal_conv1d``: the real signatures and
layouts, computing with transformers' torch fallbacks) put on sys.path, and a fresh import of
the modeling modules, whose ``use_kernel_func_from_hub_with_fallback`` then binds the packages'
functions exactly as it binds the real ones (at import, by package and internal path).
Test code only: the stand-ins are never installed and attnviz never imports them."""

from __future__ import annotations

import contextlib
import importlib
import sys
from pathlib import Path

import archs
import hybrids_tiny
import tiny
import torch
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.utils import output_capturing

STANDINS = Path(__file__).parent / "kernel_standins"
PACKAGES = ("fla", "mamba_ssm", "causal_conv1d", "standin_reference")
MODULE = {"qwen3_5_text": "qwen3_5"}  # model_type -> its modeling module, where they differ


def modeling(model: str) -> str:
    """The import name of transformers' modeling module of ``model``."""
    return f"transformers.models.{model}.modeling_{model}"


@contextlib.contextmanager
def kernel_packages(*models: str):
    """Within: the stand-ins importable and ``modeling_<model>`` of each of ``models`` imported
    afresh (its kernels bound to the stand-ins); yields those modules. Afterwards every module
    is as it was (the stand-ins gone from sys.modules and sys.path), and so is transformers'
    registry of what each model class records (``output_attentions`` and the like).

    That registry (``transformers.utils.output_capturing._CAN_RECORD_REGISTRY``) is keyed by the
    class's *name*, and every model's ``__init__`` writes its class's ``_can_record_outputs``
    there: a model built from a fresh module overwrites the entry of the original class of the
    same name with the fresh attention class. A model of the original module built before (a
    cached tiny model) then hooks no attention module (``isinstance`` against the fresh class
    fails) and returns no attention probabilities. The entries are put back on exit."""
    names = [modeling(m) for m in models]
    saved = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    recorded = dict(output_capturing._CAN_RECORD_REGISTRY)  # name -> what that class records
    sys.path.insert(0, str(STANDINS))
    try:
        yield {m: importlib.import_module(n) for m, n in zip(models, names, strict=True)}
    finally:
        sys.path.remove(str(STANDINS))
        for name in [*names, *(p for p in sys.modules if p.split(".")[0] in PACKAGES)]:
            sys.modules.pop(name, None)
        for name, module in saved.items():
            sys.modules[name] = module
            package, _, attr = name.rpartition(".")
            setattr(sys.modules[package], attr, module)
        dict.clear(output_capturing._CAN_RECORD_REGISTRY)
        dict.update(output_capturing._CAN_RECORD_REGISTRY, recorded)


def calls() -> list[str]:
    """The stand-in kernels called so far (their real names), within `kernel_packages`."""
    return sys.modules["standin_reference"].CALLS


def tiny_model(modules: dict, model_type: str, dtype: torch.dtype = torch.float32):
    """The tiny model of ``model_type`` (hybrids_tiny's shapes) built from the fresh module."""
    cfg = archs.tiny_config(model_type)
    for k, v in hybrids_tiny.SHAPES[model_type].items():
        setattr(cfg, k, list(v) if isinstance(v, tuple) else v)
    cfg.vocab_size = max(int(getattr(cfg, "vocab_size", 0) or 0), tiny.VOCAB)
    cfg.initializer_range = 0.2
    module = modules[MODULE.get(model_type, model_type)]
    cls = getattr(module, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    torch.manual_seed(0)
    return cls(cfg).eval().to(dtype)
