"""Stand-in for mamba_ssm, tests only: the real entry points, signatures and layouts, computed
by transformers' torch fallbacks (`standin_reference`)."""

from mamba_ssm.ops.selective_scan_interface import mamba_inner_fn, selective_scan_fn

__version__ = "2.2.4"
__all__ = ["mamba_inner_fn", "selective_scan_fn"]
