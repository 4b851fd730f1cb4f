"""A head in Q/K space (`qk_space`) and every head's OV circuit (`ov_circuits`, `ov_tokens`).

The OV oracle builds the full vocab x vocab circuit W_U W_O^h W_V^h W_E of a tiny model (384
tokens) with the norms' gains, and takes its eigenvalues and diagonal directly; the unrotated
keys are checked against k_proj's own output before transformers' RoPE (tests/engine/qk_oracle.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import qk_oracle
import tiny_explain as te
import torch

import attnviz
from attnviz.explain import ov_circuits, ov_tokens, qk_space
from attnviz.explain.qk_maps import layer_maps


@pytest.fixture(scope="module")
def llama():
    lm = te.build("llama")
    return lm, attnviz.explain.trace(lm, te.TEXT)


def test_keys_turned_back_are_the_keys_before_rope(llama):
    lm, tr = llama
    layer = 1
    _, attn = qk_oracle.attention_of(lm.model, layer)
    seen = {}
    h = attn.register_forward_pre_hook(
        lambda _m, a, kw: seen.__setitem__("x", kw["hidden_states"][0]), with_kwargs=True
    )
    with torch.no_grad():
        lm.model(input_ids=torch.tensor([list(tr.tokens.ids)]))
        h.remove()
        cfg = lm.model.config
        d = cfg.hidden_size // cfg.num_attention_heads
        _, k_raw = qk_oracle.q_k(attn, seen["x"], cfg.num_attention_heads, cfg.num_key_value_heads, d)
    kmap = layer_maps(lm, tr, layer)[1]
    k_post = tr.captured[layer].key[0, 1].float()
    np.testing.assert_allclose(kmap.unrotate(k_post, torch.arange(tr.n_tokens)), k_raw[1], atol=1e-4)
    space = qk_space(lm, tr, layer=layer, head=3)
    assert space.rotary and space.queries.shape == space.keys.shape == (tr.n_tokens, 2)
    assert not np.allclose(space.keys, space.keys_unrotated) and sum(space.explained) <= 1.0 + 1e-9


def test_a_nope_layer_has_one_set_of_keys():
    lm = te.build("smollm3", no_rope_layers=[1, 0])
    space = qk_space(lm, te.TEXT, layer=1, head=0)
    assert not space.rotary and np.allclose(space.keys, space.keys_unrotated)


def _full_circuit(lm, layer: int, head: int) -> torch.Tensor:
    m = lm.model.model
    d = m.config.hidden_size // m.config.num_attention_heads
    group = m.config.num_attention_heads // m.config.num_key_value_heads
    attn, block = m.layers[layer].self_attn, m.layers[layer]
    w_v = attn.v_proj.weight[(head // group) * d : (head // group + 1) * d] * block.input_layernorm.weight
    w_o = attn.o_proj.weight[:, head * d : (head + 1) * d]
    w_u = lm.model.lm_head.weight * m.norm.weight
    return (w_u @ w_o @ w_v @ m.embed_tokens.weight.T).double().detach()  # (vocab, vocab)


def test_ov_scores_and_tokens_match_the_full_circuit(llama):
    lm, _ = llama
    ov = ov_circuits(lm)
    assert ov.copying.shape == ov.positive.shape == (2, 4)
    for layer, head in ((0, 1), (1, 3)):
        full = _full_circuit(lm, layer, head)
        lam = torch.linalg.eigvals(full)
        lam = lam[lam.abs() > 1e-6 * lam.abs().max()]  # the rank is d_head: the rest is rounding
        assert len(lam) == lm.layout.head_dim
        assert ov.copying[layer, head] == pytest.approx(float(lam.sum().real / lam.abs().sum()), abs=1e-6)
        assert ov.positive[layer, head] == pytest.approx(float((lam.real > 0).double().mean()), abs=1e-9)
        copied, suppressed = ov_tokens(lm, layer, head, k=5)
        diag = torch.diagonal(full)
        assert [round(v, 4) for _, v in copied] == [round(float(v), 4) for v in torch.topk(diag, 5).values]
        assert [round(v, 4) for _, v in suppressed] == [
            round(float(v), 4) for v in -torch.topk(-diag, 5).values
        ]


@pytest.mark.parametrize("model_type", ["bamba", "qwen3_5_text"])
def test_ov_circuits_of_a_hybrids_attention_heads(model_type):
    """A hybrid's attention heads, rows by attention layer: the same full-circuit oracle, with the
    norms' gains as each modeling file writes them (Qwen3.5's RMSNorm: 1 + weight, zero at init)."""
    import hybrids_tiny

    lm = hybrids_tiny.loaded(model_type)
    ov = ov_circuits(lm)
    assert ov.blocks == lm.layout.attention_layers == (1, 3)
    model, cfg = lm.model, lm.model.config.get_text_config()
    offset = 1.0 if model_type == "qwen3_5_text" else 0.0
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    for layer, head in ((0, 1), (1, 3)):
        block = model.model.layers[ov.blocks[layer]]
        attn, d = block.self_attn, block.self_attn.head_dim
        w_v = attn.v_proj.weight[(head // group) * d : (head // group + 1) * d]
        w_v = w_v * (block.input_layernorm.weight + offset)
        w_o = attn.o_proj.weight[:, head * d : (head + 1) * d]
        final = getattr(model.model, "norm", None) or model.model.final_layernorm  # Bamba's name
        w_u = model.lm_head.weight * (final.weight + offset)
        full = (w_u @ w_o @ w_v @ model.model.embed_tokens.weight.T).double().detach()
        lam = torch.linalg.eigvals(full)
        lam = lam[lam.abs() > 1e-6 * lam.abs().max()]
        assert ov.copying[layer, head] == pytest.approx(float(lam.sum().real / lam.abs().sum()), abs=1e-6)
    assert any("gated" in n for n in ov.notes) == (model_type == "qwen3_5_text")


@pytest.mark.parametrize("model_type", ["bloom", "mpt"])
def test_ov_circuits_of_fused_qkv_models(model_type):
    """Bloom's per-head [q | k | v] and MPT's [q | k | v] blocks of one fused projection."""
    lm = te.build(model_type)
    ov = ov_circuits(lm)
    base, heads = lm.model.base_model, lm.layout.n_heads
    d, head = lm.layout.head_dim, 2
    if model_type == "bloom":
        block = base.h[1]
        attn, norm, final = block.self_attention, block.input_layernorm, base.ln_f
        w_v = attn.query_key_value.weight.view(heads, 3, d, -1)[head, 2]
        w_o = attn.dense.weight[:, head * d : (head + 1) * d]
    else:
        block = base.blocks[1]
        attn, norm, final = block.attn, block.norm_1, base.norm_f
        w_v = attn.Wqkv.weight[(2 * heads + head) * d : (2 * heads + head + 1) * d]
        w_o = attn.out_proj.weight[:, head * d : (head + 1) * d]
    w_u = lm.model.get_output_embeddings().weight * final.weight
    full = (w_u @ w_o @ (w_v * norm.weight) @ lm.model.get_input_embeddings().weight.T).double().detach()
    lam = torch.linalg.eigvals(full)
    lam = lam[lam.abs() > 1e-6 * lam.abs().max()]
    assert ov.copying[1, head] == pytest.approx(float(lam.sum().real / lam.abs().sum()), abs=1e-6)
