"""How queries, keys and values are captured: the hook transformers calls for attention
(`hook`), what one call saw (`records`), where a model's attention modules are and whether the
hook reproduces them (`sites`), adapters for families that compute attention in their own modules
(`adapters`), the exact layer-at-a-time path (`layerwise`), and statistics taken from the
forward's own kernel (`statistics`)."""

from .hook import IMPLEMENTATION, Recorder, recording
from .records import CapturedAttention

__all__ = ["IMPLEMENTATION", "CapturedAttention", "Recorder", "recording"]
