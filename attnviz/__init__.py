"""attnviz: look inside transformer attention, per layer and per head, verified against eager.

import attnviz
lm = attnviz.load_model("smollm2-135m")
res = attnviz.extract(lm, "the financial bank is located on river bank")
res.head(3, 0)            # (N, N) float32 probabilities of layer 3, head 0
attnviz.head_view(res)    # plotly figure of every head (a notebook cell also shows `res` itself)
"""

import logging

from ._version import __version__
from .errors import (
    AttnvizError,
    BadIndex,
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
from .extract import DEFAULT_MAX_TOKENS, PATHS, extract, extract_ids, tokenize
from .figures.notebook import head_view, model_view
from .layout import AttentionLayout
from .loading import BUILTIN_MODELS, DEFAULT_MODEL, LoadedModel, load_model, wrap_model
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
    "extract",
    "extract_ids",
    "head_view",
    "load_model",
    "model_view",
    "tokenize",
    "wrap_model",
]
