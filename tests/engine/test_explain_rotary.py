"""Rotary bands: the model's own pairing and frequencies, and terms that add up to the score."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_explain as TE
import torch

import attnviz
from attnviz import AttnvizError
from attnviz.explain import rotary_bands, trace
from attnviz.explain.rotary import RotarySpec, spec_from_config, spec_from_tables


def rotate(x: torch.Tensor, spec: RotarySpec, positions: torch.Tensor) -> torch.Tensor:
    """x (N, d_head) turned by position × θ in each of the spec's pairs (the rest unchanged)."""
    out = x.clone()
    ang = positions[:, None].double() * torch.tensor(spec.theta, dtype=torch.float64)
    c, s = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    for m, (a, b) in enumerate(spec.pairs):
        out[:, a] = x[:, a] * c[:, m] - x[:, b] * s[:, m]
        out[:, b] = x[:, b] * c[:, m] + x[:, a] * s[:, m]
    return out


@pytest.mark.parametrize(
    ("name", "pairing", "rotated"),
    [("llama-gqa", "half", 8), ("gpt_neox-parallel", "half", None), ("gptj", "interleaved", 4)],
)
def test_the_pairs_are_the_models_own_rotation(name, pairing, rotated):
    """Turning random vectors by the spec's pairs and θ equals the model's own rotary function."""
    lm = TE.loaded(name)
    tr = trace(lm, TE.TEXT)
    d = lm.layout.head_dim
    x = torch.randn(tr.n_tokens, d, generator=torch.Generator().manual_seed(0))
    pos = torch.arange(tr.n_tokens)
    if name == "gptj":
        from transformers.models.gptj import modeling_gptj as M

        spec = spec_from_config(lm.model.config, d)
        sincos = M.create_sinusoidal_positions(tr.n_tokens, spec.head_dim - len(spec.rest))
        sin, cos = torch.split(sincos[None], sincos.shape[-1] // 2, dim=-1)
        rot = len(spec.pairs) * 2
        theirs = torch.cat(
            [M.apply_rotary_pos_emb(x[None, :, None, :rot], sin, cos)[0, :, 0], x[:, rot:]], -1
        )
    else:
        module = __import__(type(lm.model).__module__, fromlist=["apply_rotary_pos_emb"])
        cos, sin = tr.rotary[0]
        spec = spec_from_tables(cos, sin, d)
        theirs, _ = module.apply_rotary_pos_emb(x[None, None], x[None, None], cos, sin)
        theirs = theirs[0, 0]
    assert spec.pairing == pairing
    if rotated is not None:
        assert 2 * len(spec.pairs) == rotated and len(spec.rest) == d - rotated
    else:  # NeoX: rotary_pct of the head
        assert 0 < len(spec.pairs) * 2 < d
    assert float((rotate(x, spec, pos) - theirs).abs().max()) <= 1e-5
    assert float((rotate(x, spec, pos) - x).abs().max()) > 1e-2  # it does rotate


@pytest.mark.parametrize("name", ("llama-gqa", "gpt_neox-parallel", "gptj", "falcon"))
def test_band_terms_add_up_to_the_score_the_softmax_saw(name):
    """Σ bands + unrotated rest = scaling · q · k, and differences of it between two keys equal
    the differences of log α from the model's own eager attention (no soft-cap in these)."""
    lm = TE.loaded(name)
    tr = trace(lm, TE.TEXT)
    layer, head, i = 1, 2, tr.n_tokens - 1
    eager = attnviz.extract_ids(lm, list(tr.tokens.ids), path="eager").head(layer, head)[i]
    scores = []
    for j in (0, 3, i):
        b = rotary_bands(lm, tr, layer, head, query=i, key=j)
        assert b.pair_terms.sum() + b.rest_term == pytest.approx(b.score, abs=1e-6)
        scores.append(b.score)
    logs = np.log(eager[[0, 3, i]].astype(np.float64))
    assert np.allclose(np.diff(scores), np.diff(logs), atol=1e-4)
    assert len(b.carries) == len(b.spec.pairs) == len(b.spread) == len(b.position_spread)
    assert np.all(b.spread >= 0) and np.all(np.isfinite(b.content_spread))


def test_bands_are_refused_without_rotary_and_keys_after_the_query():
    with pytest.raises(AttnvizError, match="no rotary embedding"):
        rotary_bands(TE.loaded("gpt2"), TE.TEXT, 0, 0)
    lm = TE.loaded("llama-gqa")
    with pytest.raises(AttnvizError, match="comes after"):
        rotary_bands(lm, TE.TEXT, 0, 0, query=2, key=5)


def test_a_pure_position_band_is_called_position():
    """A band whose keys all carry the same content varies only with distance: "position"; one
    whose keys differ and sit at the query's position varies only with content."""
    spec = RotarySpec("half", ((0, 2), (1, 3)), (1.0, 1e-4), (), 4)
    n = 32
    k = torch.zeros(n, 4, dtype=torch.float64)
    k[:, 0] = 1.0  # band 0: the same key content everywhere
    k[:, 1] = torch.linspace(-2, 2, n)  # band 1: content changes from key to key
    k = rotate(k, spec, torch.arange(n))
    q = rotate(torch.ones(n, 4, dtype=torch.float64), spec, torch.arange(n))
    from attnviz.explain import bands

    b = bands(q, k, spec, 1.0, i=n - 1, j=0)
    assert b.carries == ["position", "content"]
    assert b.content_spread[0] < 1e-12  # band 0: one content for every key, distance removed: constant
    assert b.position_spread[1] < 1e-12  # band 1: the average key content there is 0


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_tables_of_either_pairing_and_a_partial_rotary_are_read_as_such(pairing):
    """cos / sin tables built the two ways (halves: Llama, NeoX; neighbours: GPT-J style tables)
    over the first 6 of 10 dims give back the pairing, θ and the 4 unrotated dims."""
    theta = torch.tensor([1.0, 0.1, 0.01])
    angles = torch.arange(5.0)[:, None] * theta  # (positions, pairs)
    per_dim = torch.cat([angles, angles], -1) if pairing == "half" else angles.repeat_interleave(2, -1)
    spec = spec_from_tables(torch.cos(per_dim)[None], torch.sin(per_dim)[None], 10)
    assert spec.pairing == pairing
    want = ((0, 3), (1, 4), (2, 5)) if pairing == "half" else ((0, 1), (2, 3), (4, 5))
    assert spec.pairs == want and spec.rest == (6, 7, 8, 9)
    assert np.allclose(spec.theta, theta.numpy(), rtol=1e-5)


def band_term(q: torch.Tensor, k: torch.Tensor, pair: tuple[int, int]) -> torch.Tensor:
    a, b = pair
    return q[..., a] * k[..., a] + q[..., b] * k[..., b]


def test_each_band_is_a_true_rotation_pair_of_the_models_own_rope():
    """Σ bands = score holds for any partition of the dimensions; only the model's own pairs make
    each band's term depend on the positions through their distance alone. Queries and keys with
    one content at every position are turned by Llama's own apply_rotary_pos_emb; each band's term
    for (i, j) must equal its term for (i − s, j − s). Caught: a band built from dims of two
    different pairs (b dims reversed), which still summed to the score."""
    lm = TE.loaded("llama-gqa")
    tr = trace(lm, TE.TEXT)
    d = lm.layout.head_dim
    cos, sin = tr.rotary[0]
    spec = spec_from_tables(cos, sin, d)
    g = torch.Generator().manual_seed(3)
    n = tr.n_tokens
    q0, k0 = torch.randn(1, d, generator=g), torch.randn(1, d, generator=g)
    module = __import__(type(lm.model).__module__, fromlist=["apply_rotary_pos_emb"])
    q, k = module.apply_rotary_pos_emb(q0.expand(n, d)[None, None], k0.expand(n, d)[None, None], cos, sin)
    q, k = q[0, 0], k[0, 0]
    from attnviz.explain import bands

    i, j, s = n - 1, n - 4, 5
    far, near = bands(q, k, spec, 0.5, i=i, j=j), bands(q, k, spec, 0.5, i=i - s, j=j - s)
    assert far.score == pytest.approx(near.score, abs=1e-5)
    assert np.allclose(far.pair_terms, near.pair_terms, atol=1e-5)
    want = [0.5 * float(band_term(q[i], k[j], p)) for p in spec.pairs]
    assert np.allclose(far.pair_terms, want, atol=1e-5)
    assert np.abs(far.pair_terms).max() > 1e-2


def test_spreads_and_counterfactuals_equal_their_definitions_on_an_asymmetric_case():
    """On random contents and θ that turn less than half a circle over the text (so turning the
    distance the wrong way changes the numbers): spread = std over keys 0..i of each band's term
    (read key by key); content = q̃_i · k̃_j; position = q_i · (k̄̃ placed at j and rotated there),
    each against the test's own rotation. Caught: the position term turned by (i − j)θ instead of
    (j − i)θ; the spread as a sample std (n − 1); content keys left rotated."""
    from attnviz.explain import bands

    spec = RotarySpec("half", ((0, 3), (1, 4), (2, 5)), (0.05, 0.2, 0.37), (6,), 7)
    n, i, scaling = 9, 7, 0.8
    g = torch.Generator().manual_seed(5)
    q_raw = torch.randn(n, 7, generator=g, dtype=torch.float64)
    k_raw = torch.randn(n, 7, generator=g, dtype=torch.float64) + torch.linspace(0, 1, 7, dtype=torch.float64)
    pos = torch.arange(n)
    q, k = rotate(q_raw, spec, pos), rotate(k_raw, spec, pos)
    got = bands(q, k, spec, scaling, i=i, j=2)
    keys = range(i + 1)
    terms = np.array([[scaling * float(band_term(q[i], k[j], p)) for p in spec.pairs] for j in keys])
    assert np.allclose(got.pair_terms, terms[2], atol=1e-12)
    assert np.allclose(got.spread, terms.std(0), atol=1e-12) and got.spread.min() > 1e-3
    content = np.array(
        [[scaling * float(band_term(q_raw[i], k_raw[j], p)) for p in spec.pairs] for j in keys]
    )
    assert np.allclose(got.content_spread, content.std(0), atol=1e-12)
    mean_k = k_raw[: i + 1].mean(0, keepdim=True)
    placed = [rotate(mean_k, spec, torch.tensor([j]))[0] for j in keys]
    position = np.array([[scaling * float(band_term(q[i], placed[j], p)) for p in spec.pairs] for j in keys])
    assert np.allclose(got.position_spread, position.std(0), atol=1e-12)
    wrong_way = np.array(
        [
            [
                scaling * float(band_term(q[i], rotate(mean_k, spec, torch.tensor([2 * i - j]))[0], p))
                for p in spec.pairs
            ]
            for j in keys
        ]
    )
    assert not np.allclose(wrong_way.std(0), position.std(0), atol=1e-3)  # the case tells the direction


def test_every_query_head_reads_its_own_kv_head():
    """On a GQA model whose group (4 query heads per KV head) differs from its KV head count (2),
    every head's bands are built on the key head it reads: for each head the band score's
    differences between keys equal those of log α from the model's own eager attention. Caught:
    the KV head taken as head % kv_heads and as head // kv_heads (head 1 / head 2 read the wrong
    keys; llama-gqa's 4 heads over 2 KV heads cannot tell head // kv_heads from the rule)."""
    lm = TE.build("llama", num_attention_heads=8, num_key_value_heads=2, head_dim=8)
    assert (lm.layout.n_heads, lm.layout.n_kv_heads) == (8, 2)
    tr = trace(lm, TE.TEXT)
    layer, i = 1, tr.n_tokens - 1
    eager = attnviz.extract_ids(lm, list(tr.tokens.ids), path="eager")
    keys = (0, 3, i)
    for head in range(lm.layout.n_heads):
        scores = [rotary_bands(lm, tr, layer, head, query=i, key=j).score for j in keys]
        logs = np.log(eager.head(layer, head)[i][list(keys)].astype(np.float64))
        assert np.allclose(np.diff(scores), np.diff(logs), atol=1e-4), head
