"""Stand-in for flash-linear-attention (import name ``fla``), tests only: the real signatures
and (B, T, H, D) layouts, computed by transformers' torch fallbacks (`standin_reference`)."""

from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

__version__ = "0.4.0"
__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"]
