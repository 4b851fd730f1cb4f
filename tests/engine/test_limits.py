"""Limits are messages: sizing before allocating, and a token budget from free memory."""

from __future__ import annotations

import pytest
import torch

from attnviz import limits as L
from attnviz.errors import OutOfMemory
from attnviz.layout import AttentionLayout

# Llama-3.2-3B's attention shape and smollm2-135m's.
LLAMA3B = AttentionLayout("llama", "decoder", 28, 24, 8, 128, 3072)
SMOLLM2 = AttentionLayout("llama", "decoder", 30, 9, 3, 64, 576)


def test_require_passes_or_says_what_to_do():
    L.require(10 * 2**30, "cpu", what="x", hint="y", free=20 * 2**30)
    msg = r"^a region needs 12 GiB, 8\.00 GiB free on cpu — try a smaller region$"
    with pytest.raises(OutOfMemory, match=msg):
        L.require(12 * 2**30, "cpu", what="a region", hint="a smaller region", free=8 * 2**30)
    with pytest.raises(OutOfMemory):  # over the usable share (80 %) though under the free bytes
        L.require(9 * 2**30, "cpu", what="x", hint="y", free=10 * 2**30)


def test_token_budget_follows_free_memory_and_the_model():
    small = L.token_budget(SMOLLM2, "cpu", torch.float32, free=8 * 2**30)
    big = L.token_budget(SMOLLM2, "cpu", torch.float32, free=16 * 2**30)
    assert big == pytest.approx(2 * small, rel=1e-3)  # linear: nothing N×N is held
    assert L.token_budget(LLAMA3B, "cuda", torch.bfloat16, free=8 * 2**30) < small
    # bytes per token, by hand for the 3B shape in bf16: capture 28 * (24 + 16) * 128 * 2,
    # forward 16 * 3072 * 2, statistics 6 * 24 * 136 * 4
    per_token = 28 * 40 * 128 * 2 + 16 * 3072 * 2 + 6 * 24 * 136 * 4
    n = L.token_budget(LLAMA3B, "cuda", torch.bfloat16, free=70 * 2**30)
    assert n == int(0.8 * 70 * 2**30) // per_token  # ~130k tokens on an H100 after the weights
    L.check_tokens(n, LLAMA3B, "cuda", torch.bfloat16, free=70 * 2**30)
    with pytest.raises(OutOfMemory, match=rf"try at most {n} tokens"):
        L.check_tokens(n + 1, LLAMA3B, "cuda", torch.bfloat16, free=70 * 2**30)


def test_free_bytes_reads_the_host():
    assert L.free_bytes("cpu") > 0
    assert L.gib(3 * 2**30) == "3.00" and L.gib(96 * 2**30) == "96"


def test_all_layers_is_sized_first_and_filled_layer_by_layer(monkeypatch):
    import numpy as np
    import tiny

    import attnviz

    res = attnviz.extract(tiny.loaded("llama-gqa"), "the bank of the river and the bank of money")
    full = res.all_layers()
    expected = np.stack([t.numpy() for _, t in res.iter_layers()])
    assert full.dtype == np.float32 and full.shape == expected.shape and np.array_equal(full, expected)
    # less free memory than the stack needs: a message with the size and what to try, no array
    monkeypatch.setattr(L, "free_bytes", lambda device: full.nbytes)
    said = r"attention of all \d+ layers .* needs .* GiB free on cpu — try fewer"
    with pytest.raises(OutOfMemory, match=said):
        res.all_layers()


def test_bytes_per_element():
    """One element's bytes: bf16 / fp16 2, fp32 4, fp64 8; integer and bool masks sized as int32."""
    sizes = {torch.bfloat16: 2, torch.float16: 2, torch.float32: 4, torch.float64: 8, torch.bool: 4}
    assert {dtype: L.bytes_per_element(dtype) for dtype in sizes} == sizes
    for dtype in (torch.bfloat16, torch.float32):  # floats: what a tensor of them takes
        assert L.bytes_per_element(dtype) == torch.empty(0, dtype=dtype).element_size()


def test_bytes_per_element_has_one_home():
    """No module but attnviz/limits.py derives an element's size from a dtype (``finfo(..).bits``,
    ``dtype.itemsize``): the trace's sizing (explain/residual) and the eager benchmark's use
    `limits.bytes_per_element`. Measuring a real tensor (``t.element_size()``) is not a rule and
    stays. Caught: the trace's streams sized with its own ``finfo(dtype).bits // 8``."""
    import re
    from pathlib import Path

    import attnviz

    root = Path(attnviz.__file__).parent
    own_rule = re.compile(r"finfo\([^)]*\)\.bits|\bdtype\.itemsize|\bdtype\)\.itemsize")
    offenders = [
        f"{p.relative_to(root)}:{i}"
        for p in root.rglob("*.py")
        if p.name != "limits.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if own_rule.search(line)
    ]
    assert not offenders, offenders
