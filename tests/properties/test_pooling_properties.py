"""Pooled views against a dense reduction of the exact matrix, over generated N, cells, heads and
bins: softmax heads (`attnviz.analysis.pooling.pooled`; causal Llama with grouped K/V heads,
bidirectional BERT) and a mixer's signed matrix (`AttentionResult.mixer_pooled`: Mamba-2's SSD
and Qwen3.5's Gated DeltaNet). The results are extracted once per module for a few lengths; each
example picks one and pools it."""

from __future__ import annotations

import contextlib
import copy
import math

import hybrids_tiny
import numpy as np
import pytest
import tiny
import torch
from hypothesis import given
from hypothesis import strategies as st
from property_settings import examples

import attnviz
from attnviz.analysis import pooling as P

WORDS_PER_TEXT = (2, 6, 12)  # ~7, ~21, ~42 tokens: Mamba-2's 16-token chunks crossed, ended mid-chunk
WORDS = "the bank of the river holds money and stone while music fills a garden".split(" ")  # noqa: SIM905


def text_of(n_words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(n_words))


def dense_pool(a: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, max and max |.| over block x block cells of (heads, q, k), by plain loops; a last,
    shorter block is averaged over its own cells."""
    h, n_q, n_k = a.shape
    gq, gk = math.ceil(n_q / block), math.ceil(n_k / block)
    mean, mx, amax = (np.zeros((h, gq, gk)) for _ in range(3))
    for i in range(gq):
        for j in range(gk):
            cell = a[:, i * block : (i + 1) * block, j * block : (j + 1) * block]
            mean[:, i, j], mx[:, i, j], amax[:, i, j] = (
                cell.mean((1, 2)),
                cell.max((1, 2)),
                np.abs(cell).max((1, 2)),
            )
    return mean, mx, amax


@pytest.fixture(scope="module")
def softmax_results() -> dict:
    """Llama with grouped K/V heads (causal) and BERT (bidirectional), at each of `LENGTHS`."""
    out = {}
    for arch in ("llama-gqa", "bert"):
        lm = tiny.loaded(arch)
        out[arch] = [attnviz.extract(lm, text_of(n)) for n in WORDS_PER_TEXT]
    return out


@contextlib.contextmanager
def tiles(elements: int):
    before = P.TILE_ELEMENTS
    P.TILE_ELEMENTS = elements
    try:
        yield
    finally:
        P.TILE_ELEMENTS = before


@examples(40)
@given(data=st.data())
def test_pooled_softmax_heads_equal_a_dense_reduction(softmax_results, data):
    """Property: for any N, cells, subset of heads and tile size, the pooled mean and max of a
    softmax layer equal the mean and max of the exact (heads, N, N) matrix over the same blocks,
    a last shorter block included; causal (the zeros above the diagonal count in the mean) and
    bidirectional. Regime: grouped K/V heads (Llama, 4 heads on 2 K/V heads) and N not a
    multiple of the block."""
    arch = data.draw(st.sampled_from(sorted(softmax_results)))
    res = data.draw(st.sampled_from(softmax_results[arch]))
    n = len(res.tokens)
    stack = res.stacks[0]
    layer = data.draw(st.integers(0, res.n_layers(stack) - 1))
    n_heads = res.layer(layer, stack=stack).shape[0]
    heads = data.draw(st.lists(st.integers(0, n_heads - 1), min_size=1, max_size=n_heads, unique=True))
    cells = data.draw(st.integers(1, n + 3))
    with tiles(data.draw(st.sampled_from([P.TILE_ELEMENTS, 4 * 7 * 7, 64]))):
        view = P.pooled(res, layer, heads, cells=cells, stack=stack)
    dense = res.layer(layer, stack=stack)[heads].astype(np.float64)
    mean, mx, _ = dense_pool(dense, view.block)
    assert view.block == max(1, math.ceil(n / cells))
    np.testing.assert_allclose(view.mean, mean, atol=2e-6)
    np.testing.assert_allclose(view.max, mx, atol=2e-6)


def slow_decay(model_type: str) -> attnviz.LoadedModel:
    """The tiny model with decays near 1 per token, so blocks far below the diagonal are not zero
    (random decays make them ~0 and a wrong normaliser there invisible)."""
    model = copy.deepcopy(hybrids_tiny.model(model_type))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("A_log"):
                param.fill_(math.log(0.05))
            elif name.endswith("dt_bias"):
                param.fill_(-3.0)
    return attnviz.wrap_model(model, tiny.tokenizer(), spec=f"slow-decay-{model_type}")


def mixer_heads(res) -> list[tuple[int, str]]:
    return [(b, k) for b in range(res.layout.n_blocks) for k in res.mixers(b) if k != "attention"]


@pytest.fixture(scope="module")
def mixer_results() -> dict:
    """Mamba-2 (SSD, 16-token chunks, 2 groups) and Qwen3.5 (Gated DeltaNet) with slow decays."""
    out = {}
    for model_type in ("mamba2", "qwen3_5_text"):
        lm = slow_decay(model_type)
        out[model_type] = [attnviz.extract(lm, text_of(n)) for n in WORDS_PER_TEXT]
        res = out[model_type][-1]  # the regime: far blocks are not zero
        n = len(res.tokens)
        for block, kind in mixer_heads(res):
            a = np.abs(res.layer(block, mixer=kind))
            assert (a[:, n // 2 :, : n // 4].max((1, 2)) > 1e-2 * a.max((1, 2))).all(), (model_type, block)
    return out


@examples(40)
@given(data=st.data())
def test_pooled_signed_mixer_heads_equal_a_dense_reduction(mixer_results, data):
    """Property: a mixer head's pooled view is the signed mean and the max |A| of the exact matrix
    over the same blocks, for any N and cells; the last block, of a different size, is averaged
    over its own cells. Regime: slow decays (the blocks far below the diagonal are not zero:
    checked), several chunks (N up to 41 over 16-token chunks) and grouped heads (Mamba-2's 2
    groups, Qwen3.5's 2 key heads for 4 value heads)."""
    model_type = data.draw(st.sampled_from(sorted(mixer_results)))
    res = data.draw(st.sampled_from(mixer_results[model_type]))
    n = len(res.tokens)
    block, kind = data.draw(st.sampled_from(mixer_heads(res)))
    a = res.layer(block, mixer=kind).astype(np.float64)
    head = data.draw(st.integers(0, a.shape[0] - 1))
    cells = data.draw(st.integers(1, n + 3))
    view = res.mixer_pooled(block, kind, head, cells=cells)
    mean, _, amax = dense_pool(a[head : head + 1], view.tokens_per_bin)
    scale = np.abs(a[head]).max()
    np.testing.assert_allclose(view.mean, mean[0], atol=1e-5 * scale)
    np.testing.assert_allclose(view.absmax, amax[0], atol=1e-5 * scale)
