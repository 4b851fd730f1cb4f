"""The mixer figures (attnviz.figures.mixers): a signed effective attention is drawn on a diverging
scale centred at 0 and says what it is; parallel branches side by side with their shares; the
notebook's head_view draws a mixer block with them."""

from __future__ import annotations

import hybrids_tiny
import numpy as np
import pytest

import attnviz
from attnviz.figures import mixers as M

TEXT = "the bank of the river"


@pytest.fixture(scope="module")
def qwen():
    return attnviz.extract(hybrids_tiny.loaded("qwen3_5_text"), TEXT)


def test_signed_matrix_gets_a_diverging_scale_centred_at_zero_and_its_label():
    z = np.array([[3.0, 0.0], [-1.0, 0.5]], dtype=np.float32)  # lopsided: reach 3 up, 1 down
    fig = M.mixer_heatmap(z, ["(0) a", "(1) b"], kind="gated_delta", title="m · block 0 · head 1")
    ax = fig.layout.coloraxis
    assert ax.cmid == 0 and ax.cmin == -3 and ax.cmax == 3  # 0 is the middle colour
    assert dict(ax.colorscale)[0.5] == "rgb(247,247,247)"  # diverging: a neutral middle colour
    title = fig.layout.title.text
    assert "effective attention (signed, not probabilities)" in title and "Gated DeltaNet" in title
    assert "A (signed)" in ax.colorbar.title.text
    np.testing.assert_array_equal(fig.data[0].z, z)


def test_contribution_norms_are_sequential_from_zero_and_not_called_probabilities():
    z = np.array([[2.0, 0.0], [1.0, 4.0]], dtype=np.float32)
    fig = M.mixer_heatmap(z, ["(0) a", "(1) b"], kind="mamba")
    ax = fig.layout.coloraxis
    assert ax.cmin == 0 and ax.cmax == 4 and ax.cmid is None
    assert "not probabilities" in fig.layout.title.text and "Mamba-1" in fig.layout.title.text


def test_long_signed_matrix_is_mean_pooled_not_max_pooled():
    z = -np.ones((40, 40), dtype=np.float32)  # all negative: max-pooling would keep them, mean too
    z[::2] = 1.0  # alternating rows: a 2-row bin means 0, max-pooling would say 1
    fig = M.mixer_heatmap(z, [f"({i}) t" for i in range(40)], kind="mamba2", max_cells=400)
    assert "mean-pooled" in fig.layout.title.text
    assert np.abs(np.asarray(fig.data[0].z)).max() < 1e-6


def test_token_contributions_bars_are_the_row_coloured_by_sign(qwen):
    row = qwen.head(0, 2, mixer="gated_delta")[5]
    fig = M.token_contributions(row, list(qwen.tokens.labels), kind="gated_delta", query_label="(5) x")
    np.testing.assert_array_equal(np.asarray(fig.data[0].y), row)
    colours = list(fig.data[0].marker.color)
    assert all((c == "#b2182b") == (v > 0) for c, v in zip(colours, row, strict=True))
    assert "signed, not probabilities" in fig.layout.title.text


def test_block_view_draws_a_mixer_blocks_exact_heads_signed(qwen):
    fig = M.block_view(qwen, 0)
    assert len(fig.data) == qwen.mixer_heads(0, "gated_delta") == 4
    for h, trace in enumerate(fig.data):
        np.testing.assert_array_equal(np.asarray(trace.z), qwen.head(0, h, mixer="gated_delta"))
    assert fig.layout.coloraxis.cmid == 0 and "signed, not probabilities" in fig.layout.title.text
    with pytest.raises(ValueError, match="softmax attention only"):
        M.block_view(qwen, 1)


def test_pure_mamba_block_view_is_its_contribution_norms():
    res = attnviz.extract(hybrids_tiny.loaded("mamba"), TEXT)
    fig = M.block_view(res, 1)
    np.testing.assert_array_equal(np.asarray(fig.data[0].z), res.head(1, 0, mixer="mamba"))
    assert "not probabilities" in fig.layout.title.text and fig.layout.coloraxis.cmin == 0


def test_parallel_block_shows_both_branches_with_their_shares():
    lm = hybrids_tiny.loaded("falcon_h1")
    res = attnviz.extract(lm, TEXT)
    shares = res.branch_shares(0)
    assert set(shares.shares) == {"attention", "mamba2"}
    assert abs(sum(shares.shares.values()) - 1) < 1e-9 and min(shares.shares.values()) > 0
    fig = M.block_view(res, 0, shares=shares.shares)
    assert len(fig.data) == 2
    np.testing.assert_array_equal(np.asarray(fig.data[0].z), res.head(0, 0, mixer="attention"))
    np.testing.assert_array_equal(np.asarray(fig.data[1].z), res.head(0, 0, mixer="mamba2"))
    assert fig.layout.coloraxis.cmin == 0 and fig.layout.coloraxis2.cmid == 0
    titles = [a.text for a in fig.layout.annotations]
    assert f"{shares.shares['mamba2']:.0%} of the block's output" in titles[1]
    assert "signed, not probabilities" in titles[1] and "probabilities" in titles[0]


def test_branch_shares_apply_the_blocks_multipliers():
    """Falcon-H1 scales each branch before adding it: with the attention multiplier at 0 the
    attention branch writes nothing, so its share is 0."""
    lm = hybrids_tiny.loaded("falcon_h1")
    layer = lm.model.model.layers[0]
    before = layer.attn_out_multiplier
    try:
        layer.attn_out_multiplier = 0.0
        shares = attnviz.extract_ids(lm, [1, 5, 9, 12]).branch_shares(0)
    finally:
        layer.attn_out_multiplier = before
    assert shares.shares["attention"] == 0 and shares.shares["mamba2"] == 1


def test_mixer_statistics_match_their_definitions_on_the_dense_matrix(qwen, monkeypatch):
    from attnviz.figures import mixer_stats

    monkeypatch.setattr(mixer_stats, "TILE_ROWS", 3)  # tiles that split the rows unevenly
    got = mixer_stats.mixer_statistics(qwen, 2, "gated_delta")
    a = qwen.layer(2, mixer="gated_delta").astype(np.float64)  # (heads, N, N)
    n = a.shape[1]
    mag = np.abs(a)
    back = (np.arange(n)[:, None] - np.arange(n)[None, :]).clip(min=0)
    want = np.stack(
        [
            (mag * back).sum((1, 2)) / mag.sum((1, 2)),
            np.trace(mag, axis1=1, axis2=2) / mag.sum((1, 2)),
            np.where(a < 0, mag, 0).sum((1, 2)) / mag.sum((1, 2)),
            a.sum((1, 2)) / n,
        ],
        1,
    )
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert (got[:, 2] > 0).all()  # the delta rule's A really is signed here


def test_zamba2_shares_measure_the_shared_attentions_write_through_its_linear():
    """Zamba2's hybrid block adds the shared attention block's output, through ``linear``, to the
    stream its Mamba-2 reads: with that linear zeroed the attention branch writes nothing."""
    import archs
    import tiny
    import torch
    import transformers as tf

    cfg = archs.tiny_config("zamba2")
    cfg.vocab_size = max(cfg.vocab_size, tiny.VOCAB)
    torch.manual_seed(0)
    lm = attnviz.wrap_model(tf.AutoModelForCausalLM.from_config(cfg).eval(), tiny.tokenizer(), spec="zamba2")
    block = next(b for b, kinds in enumerate(lm.layout.mixers) if len(kinds) == 2)
    ids = [1, 5, 9, 12, 30, 7]
    shares = attnviz.extract_ids(lm, ids).branch_shares(block)
    assert abs(sum(shares.shares.values()) - 1) < 1e-9 and min(shares.shares.values()) > 0
    linear = lm.model.model.layers[block].linear
    with torch.no_grad():
        saved = linear.weight.clone()
        linear.weight.zero_()
    try:
        assert attnviz.extract_ids(lm, ids).branch_shares(block).shares["attention"] == 0
    finally:
        with torch.no_grad():
            linear.weight.copy_(saved)


def test_branch_shares_come_from_the_extracts_own_forward():
    """The shares are measured while extract runs (no forward once the result exists) and equal
    what each branch writes in a plain forward of the same tokens, multipliers applied."""
    import torch

    lm = hybrids_tiny.loaded("falcon_h1")
    forwards: list[int] = []
    counting = lm.model.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        res = attnviz.extract(lm, TEXT)
        before = len(forwards)
        shares = res.branch_shares(1)
        assert len(forwards) == before  # nothing ran again
    finally:
        counting.remove()
    layer = lm.model.model.layers[1]
    seen = {}

    def keep(kind, mult):
        return lambda _m, _a, out: seen.__setitem__(
            kind, ((out[0] if isinstance(out, tuple) else out).double()[0] * mult).norm(dim=-1)
        )

    hooks = [
        layer.self_attn.register_forward_hook(keep("attention", layer.attn_out_multiplier)),
        layer.mamba.register_forward_hook(keep("mamba2", layer.ssm_out_multiplier)),
    ]
    try:
        with torch.inference_mode():
            lm.model(input_ids=torch.tensor([list(res.tokens.ids)]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    for kind, norms in seen.items():
        np.testing.assert_allclose(shares.per_token[kind], norms.numpy(), rtol=1e-12)
    total = sum(float(v.sum()) for v in seen.values())
    assert shares.shares == pytest.approx({k: float(v.sum()) / total for k, v in seen.items()}, rel=1e-12)
    with pytest.raises(attnviz.errors.BadIndex, match="no parallel branches were measured"):
        attnviz.extract(hybrids_tiny.loaded("bamba"), TEXT).branch_shares(0)


def test_a_saved_result_keeps_its_branch_shares(tmp_path):
    from attnviz.export import load_npz, save_npz

    res = attnviz.extract(hybrids_tiny.loaded("falcon_h1"), TEXT)
    save_npz(res, tmp_path / "r.npz", format="compact")
    back, live = load_npz(tmp_path / "r.npz").branch_shares(0), res.branch_shares(0)
    assert back.shares == live.shares and back.how == live.how
    for kind, norms in live.per_token.items():
        np.testing.assert_array_equal(back.per_token[kind], norms)
