"""`qk_attribution` / `qk_row` on a hybrid's softmax attention blocks and on Bloom / MPT (ALiBi).

The stream entering an attention block is split into what every earlier block wrote (`read_stream`,
each mixer's heads through its out_proj, `attnviz.explain.qk_mixed`); the oracle
(tests/engine/qk_oracle.py, `block_scores`) rebuilds each score from the attention module's own
q_proj / k_proj (Qwen3.5's gated q_proj chunked as the module does, Bloom's and MPT's fused qkv),
q/k norms, Falcon-H1's key multiplier, Kimi Linear's latent path (its own modules and expand_kv)
and transformers' own RoPE function on the hidden states the module received, plus the ALiBi bias
the model handed it. fp32; 1e-4 relative to the row.
"""

from __future__ import annotations

import hybrids_tiny
import numpy as np
import pytest
import qk_oracle
import tiny_explain as te

from attnviz.explain import Unsupported, qk_attribution, qk_row, qk_space
from attnviz.explain.qk_mixed import MixedTrace
from attnviz.explain.qk_parts import source

TOL = 1e-4
FALCON_H1_MUP = {"attention_in_multiplier": 0.7, "key_multiplier": 1.3, "attention_out_multiplier": 0.8}
HYBRIDS = {
    "qwen3_5_text": {},  # Gated DeltaNet heads, gated attention (q_proj = [query | gate] per head)
    "qwen3_next": {},  # the same with MoE MLPs
    "bamba": {},  # Mamba-2 heads, partial rotary
    "falcon_h1": FALCON_H1_MUP,  # attention ‖ Mamba-2 in one block, μP scalars on both sides
    "lfm2": {},  # a short conv (per channel: one part), q/k layernorms
    "kimi_linear": {},  # Kimi delta heads; multi-head latent attention (latent norms, NoPE)
}


@pytest.fixture(scope="module")
def built() -> dict:
    return {}


def _model(built: dict, name: str):
    if name not in built:
        if name in HYBRIDS:
            lm = hybrids_tiny.loaded(name, **HYBRIDS[name])
        else:
            lm = te.build(name)
        built[name] = (lm, source(lm, te.TEXT))
    return built[name]


def _check_rows(lm, src, layer: int, heads: tuple[int, ...]) -> None:
    block = src.layer_blocks[layer]
    oracle = qk_oracle.block_scores(lm.model, list(src.tokens.ids), block)
    for head in heads:
        for i in range(src.n_tokens):
            row = qk_row(lm, src, layer=layer, head=head, query=i)
            want = oracle[head, i, row.keys].numpy()
            scale = max(1.0, np.abs(want).max())
            key_side = row.key_terms.sum(1) + row.position_bias
            query_side = row.query_terms.sum(1) + row.position_bias
            assert np.abs(key_side - want).max() <= TOL * scale, (head, i)
            assert np.abs(query_side - want).max() <= TOL * scale, (head, i)
            assert np.abs(row.scores - want).max() <= TOL * scale  # the model's own score


@pytest.mark.parametrize("name", list(HYBRIDS))
def test_every_cell_of_a_hybrid_attention_head_sums_to_the_hooked_score(built, name):
    lm, src = _model(built, name)
    assert isinstance(src, MixedTrace)
    layer = src.n_layers - 1
    _check_rows(lm, src, layer, (0, src.n_heads - 1))


def test_part_names_of_a_hybrid(built):
    """Mixer heads L{m}.{kind}{h}, softmax heads L{m}H{h}, a per-channel mixer L{m}.{kind}."""
    lm, src = _model(built, "qwen3_5_text")
    cell = qk_attribution(lm, src, layer=1, head=0, query=-1, key=3)
    assert cell.block == 3
    gd = [f"L{m}.gated_delta{h}" for m in (0, 2) for h in range(4)]
    want = ("embed", *gd[:4], "L0.mlp", *(f"L1H{g}" for g in range(4)), "L1.mlp", *gd[4:], "L2.mlp", "bias")
    assert cell.components == want
    assert abs(cell.error) <= TOL * max(1.0, abs(cell.score))
    space = qk_space(lm, src, layer=1, head=0)  # the Q/K scatter reads the same forward
    assert space.queries.shape == (src.n_tokens, 2) and space.rotary and space.block == 3
    lm, src = _model(built, "lfm2")
    cell = qk_attribution(lm, src, layer=0, head=1, query=-1, key=2)
    assert cell.components == ("embed", "L0.short_conv", "L0.mlp", "bias")
    labels, by = cell.by_origin()
    assert labels == ("embed", "L0", "bias") and abs(by.sum() - cell.terms.sum()) < 1e-9


def test_a_mixer_head_term_matches_a_hand_computation(built):
    """Bamba: T[a, b] with a Mamba-2 head, an MLP and an attention head, by hand from plain hooks."""
    lm, src = _model(built, "bamba")
    cell = qk_attribution(lm, src, layer=1, head=2, query=-1, key=4)  # block 3
    c, ids = cell.components, list(src.tokens.ids)
    for a, b in (("L0.mamba21", "L0.mlp"), ("L1H3", "L0.mamba22"), ("L2.mamba20", "L1H0")):
        want = qk_oracle.term(lm.model, ids, 3, 2, cell.query, cell.key, a, b)
        got = cell.terms[c.index(a), c.index(b)]
        assert abs(got - want) <= TOL * max(1.0, abs(want)), (a, b, got, want)


def test_falcon_h1_multipliers_are_read_from_the_tensors(built):
    lm, src = _model(built, "falcon_h1")
    assert src.blocks.scales[0]["attention"] == pytest.approx(0.8, rel=1e-4)
    cell = qk_attribution(lm, src, layer=1, head=0, query=-1, key=1)
    assert "L0H0" in cell.components and "L0.mamba20" in cell.components
    assert abs(cell.error) <= TOL * max(1.0, abs(cell.score))


@pytest.mark.parametrize("name", ("bloom", "mpt"))
def test_alibi_models_split_exactly_with_the_bias_as_its_own_term(built, name):
    """Bloom (attention and MLP add the residual inside their modules) and MPT (its MLP does): the
    hooked score + the model's ALiBi is Σ terms + position_bias, every cell of two heads."""
    lm, src = _model(built, name)
    assert isinstance(src, MixedTrace)
    _check_rows(lm, src, src.n_layers - 1, (0, src.n_heads - 1))
    row = qk_row(lm, src, layer=1, head=1, query=-1)
    slopes = np.diff(row.position_bias)
    assert np.ptp(row.position_bias) > 0 and np.allclose(slopes, slopes[0], atol=1e-5)  # linear in distance
    cell = qk_attribution(lm, src, layer=1, head=1, query=-1, key=3)
    assert cell.components == ("embed", *(f"L0H{g}" for g in range(4)), "L0.mlp", "bias")
    frame = cell.to_frame()
    assert frame.iloc[-1]["query_component"] == "position_bias"
    assert abs(frame["value"].sum() - cell.score) <= TOL * max(1.0, abs(cell.score))


def test_zamba2_is_refused_with_the_reason():
    with pytest.raises(Unsupported, match="concatenated with the embeddings"):
        qk_attribution(hybrids_tiny.loaded("zamba2"), te.TEXT, layer=0, head=0)


def test_a_text_too_large_for_memory_is_a_message(monkeypatch):
    """The block-by-block read asks for its memory first (the stream, every branch's write)."""
    import attnviz.limits as L
    from attnviz.errors import OutOfMemory

    monkeypatch.setattr(L, "free_bytes", lambda device: 1 << 16)
    with pytest.raises(OutOfMemory, match=r"reading \d+ tokens block by block"):
        qk_attribution(hybrids_tiny.loaded("lfm2"), te.TEXT, layer=0, head=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ("qwen3_5_text", "bamba"))
def test_past_the_kernels_chunks(name):
    """200 random tokens (the gated delta's chunk of 64 and Mamba-2's of 16 crossed): rows spread
    over the text still sum to the hooked score."""
    import torch

    lm = hybrids_tiny.loaded(name)
    ids = torch.randint(5, 300, (200,), generator=torch.Generator().manual_seed(0)).tolist()
    src = source(lm, ids)
    oracle = qk_oracle.block_scores(lm.model, ids, src.layer_blocks[-1])
    for i in (0, 63, 64, 130, 199):
        row = qk_row(lm, src, layer=src.n_layers - 1, head=1, query=i)
        want = oracle[1, i, row.keys].numpy()
        assert np.abs(row.key_terms.sum(1) - want).max() <= TOL * max(1.0, np.abs(want).max()), i
