"""attnviz: look inside transformer attention, per layer and per head, verified against eager.

import attnviz
lm = attnviz.load_model("smollm2-135m")
res = attnviz.extract(lm, "the financial bank is located on river bank")
res.head(3, 0)            # (N, N) float32 probabilities of layer 3, head 0
attnviz.head_view(res)    # plotly figure of every head (a notebook cell also shows `res` itself)
attnviz.save_npz(res, "bank.npz")   # and attnviz.load_npz("bank.npz") reads it back as a result
attnviz.flow_view(attnviz.information_flow(lm, "the financial bank is located on river"))  # why it predicts
"""

import logging

from ._version import __version__
from .errors import (
    AttnvizError,
    BadIndex,
    CannotWrite,
    EmptyInput,
    GatedModel,
    InputTooLong,
    ModelHasNoAttention,
    ModelNeedsNetwork,
    ModelNotFound,
    NotAllowed,
    OutOfMemory,
    UnsafeWeights,
)
from .explain import (
    ablate_heads,
    information_flow,
    logit_attribution,
    logit_lens,
    qk_attribution,
    qk_row,
    rotary_bands,
)
from .explain.attribution_patching import attribution_patch
from .explain.patching import patch
from .export import load_npz, save_npz
from .extract import DEFAULT_MAX_TOKENS, PATHS, extract, extract_ids
from .figures.explain import (
    ablation_view,
    attribution_view,
    flow_view,
    lens_view,
    rotary_view,
)
from .figures.notebook import head_view, model_view
from .figures.patching import head_search_view, patching_comparison_view, patching_view
from .figures.qk import qk_view
from .inputs import tokenize
from .layout import AttentionLayout
from .loading import BUILTIN_MODELS, DEFAULT_MODEL, LoadedModel, load_model, wrap_model
from .records import Check
from .result import AttentionResult
from .tokens import Tokens

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MODEL",
    "PATHS",
    "AttentionLayout",
    "AttentionResult",
    "AttnvizError",
    "BadIndex",
    "CannotWrite",
    "Check",
    "EmptyInput",
    "GatedModel",
    "InputTooLong",
    "LoadedModel",
    "ModelHasNoAttention",
    "ModelNeedsNetwork",
    "ModelNotFound",
    "NotAllowed",
    "OutOfMemory",
    "Tokens",
    "UnsafeWeights",
    "__version__",
    "ablate_heads",
    "ablation_view",
    "attribution_patch",
    "attribution_view",
    "extract",
    "extract_ids",
    "flow_view",
    "head_search_view",
    "head_view",
    "information_flow",
    "lens_view",
    "load_model",
    "load_npz",
    "logit_attribution",
    "logit_lens",
    "model_view",
    "patch",
    "patching_comparison_view",
    "patching_view",
    "qk_attribution",
    "qk_row",
    "qk_view",
    "rotary_bands",
    "rotary_view",
    "save_npz",
    "tokenize",
    "wrap_model",
]
