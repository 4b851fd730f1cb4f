"""`qk_attribution` / `qk_row`: every score of a head split exactly into query part x key part.

The oracle (tests/engine/qk_oracle.py) rebuilds the scores from the attention module's own
projections, q/k norms and transformers' own RoPE function, and single terms by hand at the
frozen norm scales, with plain hooks; the model's own eager α checks what the oracle cannot
write by hand (ALiBi, soft-cap). fp32 throughout; tolerance 1e-4 relative to the row's scale.
"""

from __future__ import annotations

import numpy as np
import pytest
import qk_oracle
import tiny_explain as te
import torch

import attnviz
from attnviz.errors import AttnvizError
from attnviz.explain import qk_attribution, qk_row

TOL = 1e-4

# name -> (model_type, overrides): each family's specific
FAMILIES = {
    "llama-gqa": ("llama", {}),  # GQA: 4 query heads on 2 KV heads
    "qwen2-bias": ("qwen2", {}),  # q/k biases
    "qwen3-qknorm": ("qwen3", {}),  # per-head q/k norms before RoPE
    "olmo2-postnorm": ("olmo2", {}),  # q/k norm over every head, norms after the blocks
    "gemma2-softcap": ("gemma2", {"attn_logit_softcapping": 5.0}),
    "neox-partial": ("gpt_neox", {"rotary_pct": 0.5}),  # partial rotary, fused qkv, parallel
    "phi-partial": ("phi", {"partial_rotary_factor": 0.5}),
    "smollm3-nope": ("smollm3", {"no_rope_layers": [1, 0]}),  # layer 1 has no RoPE
}
HOOKED = (
    "llama-gqa",
    "qwen2-bias",
    "qwen3-qknorm",
    "olmo2-postnorm",
    "neox-partial",
    "phi-partial",
    "smollm3-nope",
)


@pytest.fixture(scope="module")
def built() -> dict:
    return {}


def _model(built: dict, name: str):
    if name not in built:
        model_type, overrides = FAMILIES[name]
        lm = te.build(model_type, **overrides)
        built[name] = (lm, attnviz.explain.trace(lm, te.TEXT))
    return built[name]


def _rows(lm, tr, layer: int, head: int) -> list:
    return [qk_row(lm, tr, layer=layer, head=head, query=i) for i in range(tr.n_tokens)]


@pytest.mark.parametrize("name", HOOKED)
def test_every_cell_of_a_head_sums_to_the_hooked_score(built, name):
    """Σ key-side terms = Σ query-side terms = the oracle's score, every (query, key) of a head."""
    lm, tr = _model(built, name)
    layer = tr.n_layers - 1
    oracle = qk_oracle.scores(lm.model, list(tr.tokens.ids), layer)
    for head in (0, tr.n_heads - 1):
        for row in _rows(lm, tr, layer, head):
            want = oracle[head, row.query, row.keys].numpy()
            scale = max(1.0, np.abs(want).max())
            assert np.abs(row.key_terms.sum(1) - want).max() <= TOL * scale, (name, head, row.query)
            assert np.abs(row.query_terms.sum(1) - want).max() <= TOL * scale, (name, head, row.query)
            assert np.abs(row.scores - want).max() <= TOL * scale  # the model's own score
    cell = qk_attribution(lm, tr, layer=layer, head=1, query=-1, key=2)
    assert abs(cell.terms.sum() - float(oracle[1, -1, 2])) <= TOL * max(1.0, abs(cell.score))


@pytest.mark.parametrize("name", ("llama-gqa", "qwen3-qknorm", "qwen2-bias"))
def test_single_terms_match_a_hand_computation(built, name):
    """T[L0Hg, L0.mlp] and T[L0.mlp, L0Hg] of the last layer, by hand at the frozen RMS scales."""
    lm, tr = _model(built, name)
    layer, ids = tr.n_layers - 1, list(tr.tokens.ids)
    cell = qk_attribution(lm, tr, layer=layer, head=3, query=-1, key=5)  # GQA: KV head 1
    c = cell.components
    for a, b in (("L0H1", "L0.mlp"), ("L0.mlp", "L0H2"), ("L0H0", "L0H3")):
        want = qk_oracle.term(lm.model, ids, layer, 3, cell.query, cell.key, a, b)
        got = cell.terms[c.index(a), c.index(b)]
        assert abs(got - want) <= TOL * max(1.0, abs(want)), (name, a, b, got, want)


def test_names_and_frame(built):
    lm, tr = _model(built, "llama-gqa")
    cell = qk_attribution(lm, tr, layer=1, head=0, query=-1, key=4)
    n_heads = tr.n_heads
    assert cell.components == ("embed", *(f"L0H{g}" for g in range(n_heads)), "L0.mlp", "bias")
    frame = cell.to_frame()
    assert list(frame.columns) == ["query_component", "key_component", "value"]
    assert len(frame) == len(cell.components) ** 2
    assert abs(frame["value"].sum() - cell.score) <= TOL * max(1.0, abs(cell.score))
    assert cell.kv_head == 0 and cell.position_bias == 0.0
    top = cell.top(10)
    assert len(top) == 10 and all(abs(top[k][2]) >= abs(top[k + 1][2]) for k in range(9))
    labels, by = cell.by_origin()
    assert labels == ("embed", "L0", "bias") and abs(by.sum() - cell.terms.sum()) < 1e-9
    # the row's key side at this key is the cell's key marginal
    row = qk_row(lm, tr, layer=1, head=0, query=-1)
    at = int(np.flatnonzero(row.keys == 4)[0])
    np.testing.assert_allclose(row.key_terms[at], cell.key_marginal, atol=1e-5)
    np.testing.assert_allclose(row.query_terms[at], cell.query_marginal, atol=1e-5)
    layer_labels, per_key = row.by_origin("key")
    assert layer_labels == labels and np.allclose(per_key.sum(1), row.key_terms.sum(1))


def test_learned_positions_are_their_own_part():
    lm = te.build("gpt2")
    tr = attnviz.explain.trace(lm, te.TEXT)
    cell = qk_attribution(lm, tr, layer=1, head=0, query=-1, key=3)
    assert cell.components[:2] == ("embed", "pos")
    assert abs(cell.error) <= TOL * max(1.0, abs(cell.score))
    oracle_pos = lm.model.transformer.wpe.weight[cell.key]  # the table's row, not a difference
    qmap = attnviz.explain.qk_maps.layer_maps(lm, tr, 1)[1]
    img = qmap.linear(oracle_pos[None, None].float().detach(), torch.tensor([cell.key]), 0)
    assert img.abs().sum() > 0


def _eager_alpha(lm, ids: list[int], layer: int) -> torch.Tensor:
    lm.model.set_attn_implementation("eager")
    with torch.no_grad():
        out = lm.model(input_ids=torch.tensor([ids]), output_attentions=True)
    return out.attentions[layer][0].double()  # (heads, N, N)


def test_soft_cap_is_split_before_the_cap():
    lm = te.build("gemma2", attn_logit_softcapping=5.0)
    tr = attnviz.explain.trace(lm, te.TEXT)
    row = qk_row(lm, tr, layer=1, head=2, query=-1)
    assert any("soft-cap" in n for n in row.notes)
    capped = 5.0 * np.tanh(row.key_terms.sum(1) / 5.0)
    alpha = _eager_alpha(lm, list(tr.tokens.ids), 1)[2, -1, row.keys].numpy()
    np.testing.assert_allclose(np.exp(capped) / np.exp(capped).sum(), alpha, atol=1e-5)
    cell = qk_attribution(lm, tr, layer=1, head=2, query=-1, key=int(row.keys[-1]))
    assert cell.capped == pytest.approx(5.0 * np.tanh(cell.score / 5.0))


def test_alibi_is_its_own_term():
    """Falcon with ALiBi: the bias is a term of its own and the softmax of the split is eager's α."""
    lm = te.build("falcon", alibi=True)
    tr = attnviz.explain.trace(lm, te.TEXT)
    row = qk_row(lm, tr, layer=1, head=1, query=-1)
    assert np.ptp(row.position_bias) > 0  # distance-dependent
    total = row.key_terms.sum(1) + row.position_bias
    alpha = _eager_alpha(lm, list(tr.tokens.ids), 1)[1, -1, row.keys].numpy()
    np.testing.assert_allclose(
        np.exp(total - total.max()) / np.exp(total - total.max()).sum(), alpha, atol=1e-5
    )
    cell = qk_attribution(lm, tr, layer=1, head=1, query=-1, key=3)
    frame = cell.to_frame()
    assert frame.iloc[-1]["query_component"] == "position_bias"
    assert abs(frame["value"].sum() - cell.score) <= TOL * max(1.0, abs(cell.score))


def test_sinks_are_named_and_left_out():
    lm = te.build("gpt_oss")
    tr = attnviz.explain.trace(lm, te.TEXT)
    cell = qk_attribution(lm, tr, layer=1, head=1, query=-1, key=-2)
    assert any("sink" in n for n in cell.notes)
    assert abs(cell.error) <= TOL * max(1.0, abs(cell.score))


def test_refusals():
    lm = te.build("mistral", sliding_window=4)
    tr = attnviz.explain.trace(lm, te.TEXT)
    with pytest.raises(AttnvizError, match="does not see key 0"):
        qk_attribution(lm, tr, layer=1, head=0, query=-1, key=0)
    with pytest.raises(AttnvizError, match="head 9 is out of range"):
        qk_attribution(lm, tr, layer=1, head=9)


@pytest.mark.slow
def test_smollm2_at_1k_tokens_sums_to_the_hooked_score(smollm):
    """The built-in model at 1,024 random tokens: the last layer's head 3, rows spread over the text."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40000, (1024,), generator=g).tolist()
    tr = attnviz.explain.trace(smollm, ids)
    oracle = qk_oracle.scores(smollm.model, ids, 29)
    for query in (1, 300, 777, 1023):
        row = qk_row(smollm, tr, layer=29, head=3, query=query)
        want = oracle[3, query, row.keys].numpy()
        scale = max(1.0, np.abs(want).max())
        assert np.abs(row.key_terms.sum(1) - want).max() <= TOL * scale, query
        assert np.abs(row.query_terms.sum(1) - want).max() <= TOL * scale, query
