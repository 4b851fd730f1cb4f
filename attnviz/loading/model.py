"""`LoadedModel`, and preparing a built model for `extract` (attention implementation, layout)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from .. import capture
from ..layout import AttentionLayout
from .config import attention_layout

log = logging.getLogger(__name__)


@dataclass(eq=False)
class LoadedModel:
    """A model ready for `extract`: weights, tokenizer, layout and an inference lock.

    One instance may be shared by many threads; `extract` holds ``lock`` during a forward pass and
    returns fresh results, so nothing per-request is stored here.
    """

    spec: str
    model: Any  # transformers PreTrainedModel
    tokenizer: Any  # transformers tokenizer
    layout: AttentionLayout
    device: torch.device
    dtype: torch.dtype
    source: str  # "builtin" | "hub" | "local"
    supports_capture: bool
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _names: dict[int, str] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.spec

    @property
    def module_names(self) -> dict[int, str]:
        if self._names is None:
            self._names = {id(m): n for n, m in self.model.named_modules()}
        return self._names

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def release(self) -> None:
        """Drop the weights (and free GPU memory) when a model is switched away from."""
        self.model.to("meta")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _input_device(model: Any) -> torch.device:
    return torch.device(model.get_input_embeddings().weight.device)


def _use_capture(model: PreTrainedModel, spec: str) -> bool:
    """Switch the model to the capture attention; False where the model cannot take it."""
    can = getattr(model, "_can_set_attn_implementation", None)
    if not (callable(can) and can()):
        log.info("%s does not use AttentionInterface; its fast path runs eager", spec)
        return False
    try:
        model.set_attn_implementation(capture.IMPLEMENTATION)
    except Exception as err:  # noqa: BLE001 - fall back to eager for this model
        log.warning("%s: cannot use the capture attention (%s); fast path = eager", spec, err)
        return False
    return model.config._attn_implementation == capture.IMPLEMENTATION


def wrap_model(model: PreTrainedModel, tokenizer, spec: str = "custom") -> LoadedModel:
    """Wrap an already-built model (e.g. a tiny random one in tests) as a `LoadedModel`."""
    layout = attention_layout(model.config)
    model.eval()
    supports = _use_capture(model, spec)
    return LoadedModel(
        spec=spec,
        model=model,
        tokenizer=tokenizer,
        layout=layout,
        device=_input_device(model),
        dtype=next(model.parameters()).dtype,
        source="local",
        supports_capture=supports,
    )
