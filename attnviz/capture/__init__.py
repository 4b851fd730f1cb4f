"""How queries, keys and values are captured: the hook transformers calls for attention
(`hook`), where a model's attention modules are and whether the hook reproduces them (`sites`),
adapters for families that compute attention in their own modules (`adapters`), the exact
layer-at-a-time path (`layerwise`) and the mixers' recorder (`mixers`). What one call saw is
`attnviz.records`; the math on it is `attnviz.exact` (the forward's own statistics kernel is
`exact.statistics`)."""

from ..records import CapturedAttention
from .hook import IMPLEMENTATION, Recorder, recording

__all__ = ["IMPLEMENTATION", "CapturedAttention", "Recorder", "recording"]
