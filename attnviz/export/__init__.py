"""Saving a result to a file and reading it back: `save_npz` writes the dense probabilities
(every layer's ``(heads, N, N)``) or, for long inputs, the compact capture (each layer's queries,
keys and values) from which `load_npz` recomputes any head exactly."""

from .npz import DENSE_AUTO_BYTES, FORMATS, ExportFormat, choose_format, dense_nbytes, load_npz, save_npz

__all__ = [
    "DENSE_AUTO_BYTES",
    "FORMATS",
    "ExportFormat",
    "choose_format",
    "dense_nbytes",
    "load_npz",
    "save_npz",
]
