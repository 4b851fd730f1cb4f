"""`LoadedModel`, and preparing a built model for `extract` (attention implementation, layout)."""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from transformers import PreTrainedModel

from ..capture import adapters
from ..capture import hook as capture
from ..capture import mixers as mixer_capture
from ..capture.sites import AttentionSite, Probe, probe
from ..errors import AttnvizError, ModelHasNoAttention, OutOfMemory
from ..layout import AttentionLayout, block_mixers
from ..mixers.kinds import NOT_YET, SHOWN
from .config import attention_layout
from .device import is_out_of_memory
from .forward import Hook, LogitsAt, hooked, run

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
    supports_capture: bool  # the model runs transformers' attention functions (switchable)
    adapted: bool = False  # eager-only model whose attention modules carry attnviz's adapters
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _names: dict[int, str] | None = field(default=None, repr=False)
    probe: Probe | None = field(default=None, repr=False)  # where each attention layer lives
    notices: tuple[str, ...] = ()  # one line each: what loading had to do (cache rebuilt, not written)
    # Non-softmax token mixers (Mamba-2, gated delta, ...), captured by attnviz.capture.mixers.
    mixer_sites: tuple[mixer_capture.MixerSite, ...] = ()

    @property
    def fast_exact(self) -> bool:
        """The fast path (captured Q/K, probabilities on demand) reproduces this model exactly."""
        return (self.supports_capture or self.adapted) and (self.probe is None or self.probe.fast)

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

    def forward(
        self,
        ids: Sequence[int] | torch.Tensor | None = None,
        *,
        inputs: dict | None = None,
        hooks: Sequence[Hook] = (),
        logits_at: LogitsAt = "last",
        grad: bool = False,
        **extra: Any,
    ) -> Any:
        """Run the model once: the one front door every engine path uses (`attnviz.loading.forward`).

        Takes ``lock`` and inference mode (``grad=True``: gradients), passes no KV cache unless
        ``extra`` asks, runs the LM head only at ``logits_at`` ("last", "all", "none" or a list of
        positions; the output's ``logits`` hold those rows in that order) and registers ``hooks``
        for this thread's forward only, removed however it ends."""
        return run(self, ids, inputs=inputs, hooks=hooks, logits_at=logits_at, grad=grad, **extra)

    def hooked(self, hooks: Sequence[Hook]):
        """A block in which ``hooks`` fire for this thread's forwards only (under ``lock``, removed
        on exit): for an engine call that runs the model through another call, e.g. `extract`."""
        return hooked(self, hooks)

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


def _eager_model(model: Any) -> Any:
    """The same weights in eager attention. A model that cannot switch its attention at run time
    (Falcon, GPT-J, BLOOM, ...) is rebuilt in eager rather than switched, so its masks are the
    ones eager expects (an SDPA-built mask added to eager scores loses the causal mask)."""
    text = model.config.get_text_config()  # a wrapper's language model may run another one
    if model.config._attn_implementation == "eager" and text._attn_implementation == "eager":
        return model
    param = next(model.parameters())
    fresh = type(model)._from_config(
        copy.deepcopy(model.config), attn_implementation="eager", dtype=param.dtype
    )
    fresh.load_state_dict(model.state_dict())
    return fresh.to(param.device).eval()


def _hybrid_layout(layout: AttentionLayout, sites: dict[str, list[AttentionSite]]) -> AttentionLayout:
    """The layout with one layer per attention site; hybrids keep their own block indices."""
    model_type = layout.model_type
    if layout.kind == "encoder-decoder":
        n_dec, n_cross = len(sites.get("decoder", [])), len(sites.get("cross", []))
        if n_cross != n_dec:
            raise ModelHasNoAttention(
                f"this {model_type!r} model has {n_dec} decoder self-attention layers but {n_cross} "
                "cross-attention layers; attnviz shows one cross map per decoder layer and cannot show it"
            )
        return replace(layout, n_layers=len(sites.get("encoder", [])), n_decoder_layers=n_dec)
    found = sites["self"]
    blocks = [s.block for s in found]
    n_blocks = layout.n_layers
    if None in blocks or blocks == list(range(n_blocks)) or len(set(blocks)) != len(blocks):
        return replace(layout, n_layers=len(found))
    attention = tuple(int(b) for b in blocks if b is not None)
    types = layout.layer_types
    if len(types) == n_blocks:
        types = tuple(types[b] for b in attention)
    return replace(
        layout,
        n_layers=len(found),
        attention_layers=attention,
        n_blocks=max(n_blocks, max(attention) + 1),
        layer_types=types,
    )


def prepare(
    model: Any, tokenizer, *, spec: str, source: str, dtype: torch.dtype | None = None
) -> LoadedModel:
    """Switch ``model`` to the capture attention (or eager), find its attention layers, wrap it."""
    layout = attention_layout(model.config)
    model.eval()
    sites = mixer_capture.install(model)
    if layout.n_layers == 0:  # no attention at all (Mamba, RWKV, xLSTM): only its mixers
        return _mixers_only(model, tokenizer, spec, source, dtype, layout, sites)
    supports = _use_capture(model, spec)
    adapted = False
    if not supports:
        model = _eager_model(model)
        adapted = adapters.install(model) > 0  # GPT-J, Falcon, BLOOM, ...: a fast path of their own
        sites = mixer_capture.install(model)  # the rebuilt model's mixers (hooks are per module)
    lm = LoadedModel(
        spec=spec,
        model=model,
        tokenizer=tokenizer,
        layout=layout,
        device=_input_device(model),
        dtype=dtype or next(model.parameters()).dtype,
        source=source,
        supports_capture=supports,
        adapted=adapted,
    )
    try:
        lm.probe = probe(
            model,
            layout.kind == "encoder-decoder",
            supports or adapted,
            lm.module_names,
            switch=supports,
            tokenizer=tokenizer,
        )
    except AttnvizError:
        raise
    except Exception as err:  # noqa: BLE001 - said in a sentence that names the architecture
        if is_out_of_memory(err):
            raise OutOfMemory(
                f"{spec!r} did not fit in memory on {lm.device} for a short test run; "
                "pick a smaller model or free memory"
            ) from None
        first = (str(err).splitlines() or [""])[0][:200]
        raise AttnvizError(
            f"this {layout.model_type!r} model failed on a short test input "
            f"({type(err).__name__}: {first}); attnviz cannot show its attention"
        ) from None
    if not (supports or adapted):
        lm.probe.why_not_fast = adapters.why_not(layout.model_type) or lm.probe.why_not_fast
    lm.layout = _with_mixers(_hybrid_layout(layout, lm.probe.sites), sites)
    lm.mixer_sites = sites
    if not lm.probe.fast:
        log.info("%s: exact layer-at-a-time path (%s)", spec, lm.probe.why_not_fast)
    return lm


def _with_mixers(layout: AttentionLayout, sites: tuple[mixer_capture.MixerSite, ...]) -> AttentionLayout:
    """The layout with each block's mixers (attention where it has softmax attention)."""
    if layout.kind == "encoder-decoder":
        return layout
    attention = layout.attention_layers or tuple(range(layout.n_layers))
    mixers = block_mixers(layout.n_blocks, attention, [(s.block, s.kind) for s in sites])
    return replace(layout, mixers=mixers, n_blocks=len(mixers) if sites else layout.n_blocks)


def _mixers_only(model, tokenizer, spec, source, dtype, layout, sites) -> LoadedModel:
    """A model with no softmax attention: every block a mixer attnviz.mixers reads."""
    if not sites:
        raise ModelHasNoAttention(
            f"this {layout.model_type!r} model has neither softmax attention nor a token mixer attnviz knows"
        )
    hidden = sorted({s.kind for s in sites} - SHOWN)
    if hidden and not ({s.kind for s in sites} & SHOWN):
        raise ModelHasNoAttention(
            f"this {layout.model_type!r} model has no softmax attention, and its {', '.join(hidden)} "
            f"mixer {NOT_YET.get(hidden[0], 'is not shown in this version')}"
        )
    return LoadedModel(
        spec=spec,
        model=model,
        tokenizer=tokenizer,
        layout=_with_mixers(layout, sites),
        device=_input_device(model),
        dtype=dtype or next(model.parameters()).dtype,
        source=source,
        supports_capture=True,
        probe=Probe(sites={"self": []}, fast=True),
        mixer_sites=sites,
    )


def wrap_model(model: PreTrainedModel, tokenizer, spec: str = "custom") -> LoadedModel:
    """Wrap an already-built model (e.g. a tiny random one in tests) as a `LoadedModel`."""
    return prepare(model, tokenizer, spec=spec, source="local")
