"""Helpers the atlas tests share: a tiny model saved as a folder, and "the same answer"."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import tiny

from attnviz import atlas as AT


def save_tiny(folder: Path, arch: str = "gpt2") -> Path:
    """A tiny model as a folder (what a Ray worker or the command line loads by its path)."""
    if not (folder / "config.json").exists():
        tiny.model(arch).save_pretrained(folder)
        tiny.tokenizer(tiny.tokenizer_kind(arch)).save_pretrained(folder)
    return folder


def same(a: AT.Atlas, b: AT.Atlas) -> None:
    """Two atlases are the same answer: texts, tokens, statistics, links, skipped, tables."""
    assert a.texts == b.texts and a.tokens == b.tokens and a.skipped == b.skipped
    assert a.indices == b.indices and a.keys == b.keys
    for s in AT.STATISTICS:
        np.testing.assert_array_equal(a.values[s], b.values[s])
    np.testing.assert_array_equal(a.links, b.links)
    pd.testing.assert_frame_equal(a.to_frame(), b.to_frame())
