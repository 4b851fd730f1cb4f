"""The readable reference (attnviz/reference/attention.py) is the oracle of every fast path.

First the reference itself against transformers: its probabilities equal transformers' own
`eager_attention_forward` under transformers' own masks (GQA, causal, sliding window, padding,
soft-capping). Then every path that makes a probability on the product side equals the reference
on the captured Q and K of tiny models (GQA, sliding window, soft-capping, biases): the result
itself, the dense path (`exact.probabilities`, also in causal blocks), the model's eager oracle
(`exact.eager`), the log-sum-exp identity p = exp(s − L) (`exact.lse` through `exact.fused` /
`attnviz.backend`), the fused pass's E_p[v] (`exact.fused.attend`) and the pooling tiles at one
token per cell (`analysis.pooling`)."""

from __future__ import annotations

import pytest
import tiny_explain as TE
import torch
from reference_call import reference_of
from transformers import masking_utils as MU
from transformers.models.llama.modeling_llama import eager_attention_forward

import attnviz
from attnviz.analysis import pooling
from attnviz.exact import fused, probabilities
from attnviz.exact.eager import eager_probabilities
from attnviz.exact.lse import layer_lse, layer_spec
from attnviz.layout import repeat_kv
from attnviz.reference.attention import allowed_keys, attention_probabilities, head_outputs


class _Module(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.training = False


@pytest.mark.parametrize(
    ("nh", "nkv", "window", "softcap"), [(4, 2, None, None), (4, 1, 3, None), (2, 2, None, 2.0)]
)
def test_the_reference_is_transformers_eager_attention(nh, nkv, window, softcap):
    """A padded batch (left padding in one row) through transformers' own mask builder and
    eager attention; the reference equals it on every row that has a real query. Caught (in the
    reference): KV heads tiled instead of repeated, the window off by one, the causal offset."""
    g = torch.Generator().manual_seed(0)
    b, t, hs = 2, 7, 8
    q = torch.randn(b, nh, t, hs, generator=g)
    k = torch.randn(b, nkv, t, hs, generator=g)
    v = torch.randn(b, nkv, t, hs, generator=g)
    pad = torch.ones(b, t, dtype=torch.bool)
    pad[1, :2] = False  # row 1: two padding tokens on the left
    fn = MU.causal_mask_function if window is None else MU.sliding_window_causal_mask_function(window)
    mask = MU.eager_mask(batch_size=b, q_length=t, kv_length=t, mask_function=fn, attention_mask=pad)
    scaling = hs**-0.5
    module = _Module(nh // nkv)
    kwargs = {} if softcap is None else {"softcap": softcap}
    if softcap is not None:
        from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as eager
    else:
        eager = eager_attention_forward
    out, theirs = eager(module, q, k, v, mask, scaling=scaling, dropout=0.0, **kwargs)
    ours = attention_probabilities(q, k, scaling=scaling, sliding_window=window, padding=pad, softcap=softcap)
    real = pad[:, None, :, None].expand_as(ours)  # queries that are real tokens
    torch.testing.assert_close(
        ours[real.expand_as(ours)], theirs.float()[real.expand_as(ours)], atol=1e-6, rtol=1e-5
    )
    z = head_outputs(ours, v).transpose(1, 2)  # (B, T, nh, hs) as eager returns it
    torch.testing.assert_close(z[pad], out[pad], atol=1e-5, rtol=1e-5)
    assert ours[1, :, :2].abs().max() == 0  # padding queries: no key, all 0


def test_repeat_kv_is_transformers_order():
    from transformers.models.llama.modeling_llama import repeat_kv as theirs

    kv = torch.randn(1, 3, 5, 4)
    assert torch.equal(repeat_kv(kv, 4), theirs(kv, 4))
    assert allowed_keys(3, 5, sliding_window=2)[0, 0].tolist() == [
        [False, True, True, False, False],
        [False, False, True, True, False],
        [False, False, False, True, True],
    ]  # three queries at positions 2..4 of 5, window 2: each sees itself and the key before


FAST = ("llama-gqa", "mistral-sliding", "gemma2", "qwen2-bias", "gpt2")


@pytest.mark.parametrize("name", FAST)
def test_every_fast_path_equals_the_reference(name, monkeypatch):
    """Caught: the dense path's causal blocks one key short; the GQA index h % kv instead of
    h // group in the dense path; the tile causal cut one key early."""
    lm = TE.loaded(name)
    res = attnviz.extract(lm, TE.TEXT)
    n = len(res.tokens)
    for layer in range(res.n_layers()):
        cap = res.captured(layer, "self")
        ref = reference_of(cap)  # (heads, N, N)
        assert ref.shape == (lm.layout.n_heads, n, n)
        close = dict(atol=2e-6, rtol=1e-5)
        torch.testing.assert_close(torch.from_numpy(res.layer(layer)).float(), ref, **close)
        torch.testing.assert_close(probabilities.probs_from_capture(cap), ref, **close)
        monkeypatch.setattr(probabilities, "_CAUSAL_BLOCK", 4)  # the causal block path at N > 4
        torch.testing.assert_close(
            probabilities.probs_from_capture(cap, rows=slice(2, n)), ref[:, 2:], **close
        )
        monkeypatch.undo()
        torch.testing.assert_close(eager_probabilities(lm.model, cap), ref, **close)
        spec, why = layer_spec(cap, lm.layout, layer, "self")
        if spec is None:  # soft-capping, ...: the dense path is the product's; nothing fused to check
            assert name == "gemma2", why
            continue
        group = cap.query.shape[1] // cap.key.shape[1]
        q, k = cap.query[0].float(), cap.key[0].float().repeat_interleave(group, 0)
        v = cap.value[0].float().repeat_interleave(group, 0)
        s = q @ k.transpose(-1, -2) * cap.scaling  # (heads, N, N) raw scores
        lse = layer_lse(cap, spec)  # (heads, N)
        torch.testing.assert_close(torch.exp(s - lse[..., None]) * (ref > 0), ref, **close)  # p = exp(s − L)
        att = fused.attend(q, k, v, scale=cap.scaling, spec=spec)
        torch.testing.assert_close(att.out, (ref @ v), atol=1e-5, rtol=1e-5)  # E_p[v] = P V
        torch.testing.assert_close(att.lse, lse, atol=1e-5, rtol=1e-5)
        monkeypatch.setattr(pooling, "TILE_ELEMENTS", cap.query.shape[1] * n * 5)  # chunks of 5 rows: ragged
        view = pooling.pooled(res, layer, cells=n)  # one token per cell: the tiles' own p
        monkeypatch.undo()
        assert view.block == 1
        torch.testing.assert_close(torch.from_numpy(view.mean).float(), ref, **close)


@pytest.mark.parametrize("name", ["llama-gqa", "mistral-sliding"])
def test_every_source_of_a_layer_equals_the_reference(name):
    """`attnviz.exact.sources`: a layer kept in any form (captured Q/K, recomputed one layer at a
    time, the eager tensor) gives the reference's rows for any heads and rows; the captured
    form's log tiles give its entries on a rectangle, the other forms say why they have none.
    Caught: the stored and recomputed forms' head selection dropped (every head returned); the
    log tiles' L of the wrong heads (lse not cut to the asked heads)."""
    import dataclasses

    from attnviz.exact import sources

    lm = TE.loaded(name)
    fast = attnviz.extract(lm, TE.TEXT)
    slow = dataclasses.replace(lm, probe=dataclasses.replace(lm.probe, fast=False, why_not_fast="test"))
    layerwise = attnviz.extract(slow, TE.TEXT)  # the layer-at-a-time path
    eager = attnviz.extract(lm, TE.TEXT, path="eager")
    n = len(fast.tokens)
    heads, rows = [3, 0], slice(2, n - 1)
    close = dict(atol=2e-6, rtol=1e-5)
    for layer in range(fast.n_layers()):
        ref = reference_of(fast.captured(layer, "self"))  # (heads, N, N)
        forms = [(fast, sources.Captured), (layerwise, sources.Recomputed), (eager, sources.Stored)]
        for res, form in forms:
            src = res.source(layer)
            assert type(src) is form
            torch.testing.assert_close(src.probabilities(None, None), ref, **close)
            torch.testing.assert_close(src.probabilities(heads, rows), ref[heads, rows], **close)
            tiles, why = src.log_tiles(heads)
            if form is not sources.Captured:
                assert tiles is None and why == sources.EAGER_REASON
                continue
            assert tiles is not None and why == "fused"
            got = torch.exp(tiles.scores(1, 5, 0, n) - tiles.lse[:, 1:6, None])
            torch.testing.assert_close(got, ref[heads, 1:6], **close)


def test_records_and_results_name_dimensions_by_the_glossary():
    """attnviz.records and attnviz.result write shapes in the glossary's names (reference/attention:
    heads, kv_heads, group, query_pos, key_pos, d_head, d_model), never a synonym. Caught: records
    wrote q_pos and hidden, result N×N, beside result's query_pos."""
    import re
    from pathlib import Path

    import attnviz.reference.attention as glossary

    for name in ("query_pos", "key_pos", "kv_head", "d_head", "d_model", "group"):
        assert name in (glossary.__doc__ or "")
    synonyms = re.compile(r"\b(q_pos|k_pos|kv_pos|seq_len|head_dim|hidden|n_ctx|N×N)\b")
    root = Path(attnviz.__file__).parent
    found = [
        f"{name}:{i}: {m.group(0)}"
        for name in ("records.py", "result.py")
        for i, line in enumerate((root / name).read_text().splitlines(), 1)
        if (m := synonyms.search(line))
    ]
    assert not found, found
