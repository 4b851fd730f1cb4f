"""Logit lens, direct logit attribution and head ablation against independent computations."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import tiny_explain as TE
import torch

import attnviz
from attnviz import AttnvizError
from attnviz.explain import ablate_heads, logit_attribution, logit_lens, trace
from attnviz.explain.ablation import ablated_logits

READOUT_MODELS = (
    "llama-gqa",
    "gpt2",
    "gemma2",
    "olmo2",
    "gpt_neox-parallel",
    "falcon",
    "gptj",
)  # gptj: LM-head bias


def tiered(names, fast):
    """``names`` as parameters, those outside ``fast`` marked slow (the fast tier stays quick)."""
    return [n if n in fast else pytest.param(n, marks=pytest.mark.slow) for n in names]


OUT_PROJ = ("o_proj", "dense", "c_proj", "out_proj")


def out_proj(lm, layer: int):
    attn = lm.model.get_submodule(lm.probe.sites["self"][layer].module_name)
    return next(getattr(attn, n) for n in OUT_PROJ if hasattr(attn, n))


def model_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


@pytest.mark.parametrize("name", tiered(READOUT_MODELS, ("llama-gqa", "gemma2", "gptj")))
def test_logit_lens_reads_the_models_own_hidden_states(name):
    """Rows 0 .. L-1 equal unembed(final norm(h)) of transformers' own output_hidden_states; the
    last row is the model's prediction (rank 0) with its own probabilities."""
    lm = TE.loaded(name)
    tr = trace(lm, TE.TEXT)
    lens = logit_lens(lm, tr, positions=[0, 5, -1], k=3)
    ids = list(tr.tokens.ids)
    with torch.inference_mode():
        out = lm.model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
        head, norm = lm.model.get_output_embeddings(), attnviz.explain.residual.final_norm(lm)[1]
        cap = getattr(lm.model.config, "final_logit_softcapping", None)
        for layer in range(tr.n_layers):
            logits = head(norm(out.hidden_states[layer][:, list(lens.positions)]))[0].float()
            if cap:
                logits = torch.tanh(logits / cap) * cap
            top = torch.softmax(logits, -1).topk(3)
            assert np.array_equal(top.indices.numpy(), lens.top_ids[layer]), layer
            assert np.allclose(top.values.numpy(), lens.top_probs[layer], atol=1e-5), layer
    final = torch.softmax(out.logits[0, list(lens.positions)].float(), -1)
    assert np.array_equal(final.argmax(-1).numpy(), lens.predicted)
    assert (lens.rank[-1] == 0).all()
    assert np.allclose(final.max(-1).values.numpy(), lens.prob[-1], atol=1e-5)
    if name != "gptj":  # its byte tokens show the display bug of the xfail below
        assert lens.top_tokens[-1][2][0] == lens.predicted_tokens[2]
    assert len(lens.to_frame()) == (tr.n_layers + 1) * 3 * 3


@pytest.mark.parametrize("name", tiered(READOUT_MODELS, ("llama-gqa", "gemma2", "gpt_neox-parallel")))
def test_attribution_parts_sum_to_the_logit_and_match_the_heads_own_outputs(name):
    """embedding + heads + MLPs + rest = logit(target) − logit(contrast) (1e-4 relative), and each
    head's share equals r · W_O^h z^h with z the input the model's own output projection read."""
    lm = TE.loaded(name)
    tr = trace(lm, TE.TEXT)
    t = tr.n_tokens - 3
    att = logit_attribution(lm, tr, token=t, contrast=7)
    logits = model_logits(lm.model, list(tr.tokens.ids))[t]
    cap = getattr(lm.model.config, "final_logit_softcapping", None)
    raw = (cap * torch.atanh(logits / cap)) if cap else logits  # the logits before the soft-cap
    want = float(raw[att.target] - raw[7])
    assert att.target == int(logits.argmax()) and att.contrast == 7
    assert abs(att.logit - want) <= 1e-4 * max(1.0, abs(want))
    total = att.embedding + att.heads.sum() + att.mlps.sum() + att.rest
    assert abs(total - att.logit) <= 1e-4 * max(1.0, abs(att.logit)) and abs(att.error) <= 1e-4
    assert np.abs(att.heads).max() > 1e-3  # the heads do contribute something
    # each head: the model's own concatenated heads (input of W_O) at row t
    seen: dict[int, torch.Tensor] = {}
    hooks = [
        out_proj(lm, layer).register_forward_pre_hook(
            lambda _m, a, layer=layer: seen.__setitem__(layer, a[0][0, t])
        )
        for layer in range(tr.n_layers)
    ]
    try:
        model_logits(lm.model, list(tr.tokens.ids))
    finally:
        for h in hooks:
            h.remove()
    from attnviz.explain.attribution import readout

    r, _ = readout(lm, tr, t, att.target, 7)
    for layer in range(tr.n_layers):
        z = seen[layer].float().reshape(tr.n_heads, -1)
        w_o = tr.w_o(lm, layer)
        for h in range(tr.n_heads):
            vec = w_o[h] @ z[h]
            norm = tr.attn_norm[layer]
            vec = vec if norm is None else norm.apply(vec[None], t)[0]
            assert abs(float(vec @ r) - att.heads[layer, h]) <= 1e-4, (layer, h)
    assert att.ranking(3)[0][3] == max((p[3] for p in att.ranking()), key=abs)


def by_hand(lm, layer: int, head: int, mean: torch.Tensor | None):
    """A copy of the model whose W_O columns for ``head`` are 0 (and, for mean ablation, whose
    output bias adds W_O^h · mean): the head's output replaced without attnviz."""
    model = copy.deepcopy(lm.model)
    lm2 = attnviz.wrap_model(model, lm.tokenizer, spec="by-hand")
    proj = out_proj(lm2, layer)
    d = lm.layout.head_dim
    with torch.no_grad():
        w = proj.weight  # (d_model, heads * d_head), or (in, out) for GPT-2's Conv1D
        cols = slice(head * d, (head + 1) * d)
        conv = type(proj).__name__ == "Conv1D"
        block = (w[cols].T if conv else w[:, cols]).clone()
        (w[cols] if conv else w[:, cols]).zero_()
        if mean is not None:
            extra = block @ mean
            if proj.bias is None:
                proj.bias = torch.nn.Parameter(extra)
            else:
                proj.bias += extra
    return model


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("llama-gqa", "zero"),
        ("gpt_neox-parallel", "mean"),
        *[
            pytest.param(n, m, marks=pytest.mark.slow)
            for n, m in (
                ("llama-gqa", "mean"),
                ("gpt_neox-parallel", "zero"),
                ("gemma2", "zero"),
                ("gemma2", "mean"),
                ("gpt2", "zero"),
                ("gpt2", "mean"),
            )
        ],
    ],
)
def test_ablation_equals_a_run_with_the_head_replaced_by_hand(name, mode):
    lm = TE.loaded(name)
    tr = trace(lm, TE.TEXT)
    layer, head, t = 1, 2, tr.n_tokens - 2
    mean = None
    if mode == "mean":  # the head's mean output over the positions, from the model's own W_O input
        seen = []
        hook = out_proj(lm, layer).register_forward_pre_hook(lambda _m, a: seen.append(a[0][0]))
        model_logits(lm.model, list(tr.tokens.ids))
        hook.remove()
        d = lm.layout.head_dim
        mean = seen[0][:, head * d : (head + 1) * d].float().mean(0)
    want = model_logits(by_hand(lm, layer, head, mean), list(tr.tokens.ids))[t]
    got = ablated_logits(lm, tr, ((layer, head),), mode, t)
    assert float((got - want).abs().max()) <= 1e-5
    clean = model_logits(lm.model, list(tr.tokens.ids))[t]
    assert float((got - clean).abs().max()) > 1e-3  # the ablation changed something
    ab = ablate_heads(lm, tr, [(layer, head)], mode, token=t)
    assert ab.logit_after == pytest.approx(float(want[ab.target]), abs=1e-5)
    assert ab.logit_before == pytest.approx(float(clean[ab.target]), abs=1e-5)
    assert ab.kl > 0 and ab.top_before[0][0] == ab.target
    if mode == "zero":  # the direct effect of removing a head is minus its direct attribution
        att = logit_attribution(lm, tr, token=t, target=ab.target)
        assert ab.direct[(layer, head)] == pytest.approx(-att.heads[layer, head], abs=1e-5)


def test_ablation_is_refused_where_the_model_runs_its_own_attention():
    lm = TE.loaded("gptj")
    with pytest.raises(AttnvizError, match=r"own eager code|adapter"):
        ablate_heads(lm, TE.TEXT, [(0, 0)])
    with pytest.raises(AttnvizError, match="out of range"):
        ablate_heads(TE.loaded("llama-gqa"), TE.TEXT, [(9, 0)])


class Stop(Exception):
    pass


def test_progress_hears_every_layer_and_a_raise_cancels_cleanly():
    """The trace, the routes and the ablation's rerun report each layer (the page's progress bar);
    an exception raised from the report stops the work, and the model runs unedited afterwards."""
    lm = TE.loaded("llama-gqa")
    heard: list[tuple[int, int]] = []
    tr = trace(lm, TE.TEXT, progress=lambda d, n: heard.append((d, n)))
    n = tr.n_layers
    assert heard == [(i, n) for i in range(1, n + 1)]
    heard.clear()
    attnviz.information_flow(lm, tr, progress=lambda d, n: heard.append((d, n)))
    assert heard == [(i, n) for i in range(1, n + 1)]
    heard.clear()
    ab = ablate_heads(lm, tr, [(1, 2)], progress=lambda d, n: heard.append((d, n)))
    assert heard == [(i, n) for i in range(1, n + 1)] and ab.kl > 0

    def stop(done: int, _total: int) -> None:
        if done == 1:
            raise Stop

    for work in (
        lambda: trace(lm, TE.TEXT, progress=stop),
        lambda: attnviz.information_flow(lm, tr, progress=stop),
        lambda: ablate_heads(lm, tr, [(1, 2)], progress=stop),
    ):
        with pytest.raises(Stop):
            work()
    clean = model_logits(lm.model, list(tr.tokens.ids))[-1]
    assert float((clean - tr.logits).abs().max()) <= 1e-5  # no edit or hook left behind
    assert ablate_heads(lm, tr, [(1, 2)]).logit_after == pytest.approx(ab.logit_after, abs=1e-6)


def frozen_final_norm_by_hand(lm, ids: list[int], t: int):
    """v ↦ the final norm's linear part at row t, its scale frozen at the forward's value, from the
    module's own weights and the input the model gave it (RMSNorm or LayerNorm; no attnviz)."""
    _, norm = attnviz.explain.residual.final_norm(lm)
    seen = []
    hook = norm.register_forward_pre_hook(lambda _m, a: seen.append(a[0][0, t].float()))
    model_logits(lm.model, ids)
    hook.remove()
    x = seen[0]
    eps = next(float(getattr(norm, a)) for a in ("variance_epsilon", "eps") if hasattr(norm, a))
    g = norm.weight.detach().float()
    if isinstance(norm, torch.nn.LayerNorm):
        s = 1.0 / torch.sqrt(x.var(unbiased=False) + eps)
        return lambda v: g * (v - v.mean()) * s
    s = 1.0 / torch.sqrt((x * x).mean() + eps)
    return lambda v: g * v * s


@pytest.mark.parametrize("name", ["llama-gqa", "gpt_neox-parallel"])
def test_mean_ablation_direct_effect_equals_a_frozen_norm_readout_by_hand(name):
    """The direct effect of replacing head h's output by its mean is u · N_f(W_O^h (mean − z^h))
    with u the target's unembedding row and N_f the final norm frozen at this token: computed here
    from the model's own o_proj input, o_proj weight and final-norm input (no attnviz readout).
    Caught: the replacement's sign flipped (z − mean), the zero replacement used in mean mode."""
    lm = TE.loaded(name)
    tr = trace(lm, TE.TEXT)
    ids, t, d = list(tr.tokens.ids), tr.n_tokens - 2, lm.layout.head_dim
    pairs = [(1, 2), (0, 1)]
    seen: dict[int, torch.Tensor] = {}
    hooks = [
        out_proj(lm, layer).register_forward_pre_hook(
            lambda _m, a, layer=layer: seen.__setitem__(layer, a[0][0])
        )
        for layer in {p[0] for p in pairs}
    ]
    try:
        model_logits(lm.model, ids)
    finally:
        for h in hooks:
            h.remove()
    n_f = frozen_final_norm_by_hand(lm, ids, t)
    ab = ablate_heads(lm, tr, pairs, "mean", token=t)
    u = lm.model.get_output_embeddings().weight.detach().float()[ab.target]
    for layer, head in pairs:
        z_all = seen[layer][:, head * d : (head + 1) * d].float()  # (positions, d_head)
        w = out_proj(lm, layer).weight.detach().float()[:, head * d : (head + 1) * d]  # (d_model, d_head)
        want = float(u @ n_f(w @ (z_all.mean(0) - z_all[t])))
        assert abs(want) > 1e-3  # the check can tell a sign
        assert ab.direct[(layer, head)] == pytest.approx(want, abs=1e-4), (layer, head)


@pytest.mark.parametrize("name", ["gptj", "llama-gqa"])
def test_attribution_on_a_model_with_an_lm_head_bias(name):
    """GPT-J's LM head has a bias (and llama-gqa gets one here): the parts plus the rest still give
    the model's own logit difference, so the bias belongs to the constant. Caught: the LM-head bias
    dropped from `readout`'s constant."""
    lm = TE.loaded(name)
    if lm.model.get_output_embeddings().bias is None:
        lm = attnviz.wrap_model(copy.deepcopy(lm.model), lm.tokenizer, spec="biased")
        head = lm.model.get_output_embeddings()
        head.bias = torch.nn.Parameter(
            torch.randn(head.weight.shape[0], generator=torch.Generator().manual_seed(1))
        )
    bias = lm.model.get_output_embeddings().bias.detach()
    tr = trace(lm, TE.TEXT)
    t = tr.n_tokens - 3
    att = logit_attribution(lm, tr, token=t, contrast=7)
    logits = model_logits(lm.model, list(tr.tokens.ids))[t]
    assert abs(float(bias[att.target] - bias[7])) > 1e-2  # the bias matters to this difference
    want = float(logits[att.target] - logits[7])
    assert abs(att.logit - want) <= 1e-4 * max(1.0, abs(want))
    total = att.embedding + att.heads.sum() + att.mlps.sum() + att.rest
    assert abs(total - want) <= 1e-4 * max(1.0, abs(want))


def test_logit_lens_default_positions_and_every_rows_rank_and_probability():
    """Without positions the lens reads the last 16 tokens; at every layer boundary 0..L (not only
    the last) the prediction's rank and probability equal those of unembed(final norm(h)) on
    transformers' own hidden states. Caught: default positions off by one / the first 16; rank
    counted with >= ; the rank/probability rows taken from the final row only."""
    lm = TE.loaded("llama-gqa")
    tr = trace(lm, TE.TEXT)
    n = tr.n_tokens
    assert n > 17  # the default is a proper subset
    lens = logit_lens(lm, tr, k=2)
    assert lens.positions == tuple(range(n - 16, n))
    pos = list(lens.positions)
    with torch.inference_mode():
        out = lm.model(
            input_ids=torch.tensor([list(tr.tokens.ids)]), output_hidden_states=True, use_cache=False
        )
        head, norm = lm.model.get_output_embeddings(), attnviz.explain.residual.final_norm(lm)[1]
        predicted = out.logits[0, pos].float().argmax(-1)  # (P,)
        assert np.array_equal(predicted.numpy(), lens.predicted)
        for layer in range(tr.n_layers + 1):
            h = out.hidden_states[layer][:, pos] if layer < tr.n_layers else None
            logits = head(norm(h))[0].float() if h is not None else out.logits[0, pos].float()
            mine = logits.gather(1, predicted[:, None])
            rank = (logits > mine).sum(-1).numpy()
            prob = torch.softmax(logits, -1).gather(1, predicted[:, None])[:, 0].numpy()
            assert np.array_equal(rank, lens.rank[layer]), layer
            assert np.allclose(prob, lens.prob[layer], atol=1e-5), layer
    assert (lens.rank[: tr.n_layers] > 0).any()  # the rows differ from the last one's all-zero ranks


def _byte_ids(lm) -> tuple[int, int]:
    """Ids of the byte tokens 0xD3 and 0xA4 (GPT-2's byte alphabet spells them 'Ó', '¤'): side by
    side they are the UTF-8 of 'Ӥ', alone each is no character."""
    d3, a4 = lm.tokenizer.convert_tokens_to_ids(["Ó", "¤"])
    assert lm.tokenizer.convert_ids_to_tokens([d3, a4]) == ["Ó", "¤"]
    return int(d3), int(a4)


def test_each_lens_cell_shows_its_own_tokens_display():
    """A lens cell, a prediction, an ablation's top-k entry and an attribution's target and
    contrast each show their own id's display (the rule of attnviz.tokens applied to that id
    alone), never a character merged with the id listed beside them. Caught: the lens building
    all its top ids as one text ('Ӥ⟨1/2⟩' for the byte ⟨D3⟩ beside ⟨A4⟩, 12 cells on GPT-J's tiny
    tokenizer); the same in the ablation's top-k (on gpt2) and the attribution's (target,
    contrast)."""
    from attnviz.tokens import Tokens

    lm = TE.loaded("gptj")
    tr = trace(lm, TE.TEXT)

    def own(i) -> str:
        return Tokens.build(lm.tokenizer, [int(i)]).display[0]

    lens = logit_lens(lm, tr, k=3)
    assert list(lens.predicted_tokens) == [own(i) for i in lens.predicted]
    cells = [c for row in lens.top_tokens for cell in row for c in cell]
    for row, shown_row in zip(lens.top_ids, lens.top_tokens, strict=True):
        for ids, shown in zip(row, shown_row, strict=True):
            assert list(shown) == [own(i) for i in ids]
    assert any(c.startswith("⟨") and c.endswith("⟩") for c in cells)  # lone bytes are listed here
    assert not [c for c in cells if "/" in c and c.endswith("⟩")]  # no cell is part of a split character

    d3, a4 = _byte_ids(lm)
    att = logit_attribution(lm, tr, target=d3, contrast=a4)
    assert (att.target_token, att.contrast_token) == ("⟨D3⟩", "⟨A4⟩")  # not 'Ӥ⟨1/2⟩', 'Ӥ⟨2/2⟩'

    lm = TE.loaded("gpt2")  # GPT-J's heads run in attnviz's adapter: no ablation there
    abl = ablate_heads(lm, trace(lm, TE.TEXT), [(0, 0)], k=100)  # lone bytes side by side in its top 100
    for top in (abl.top_before, abl.top_after):
        assert [s for _, s, _ in top] == [own(i) for i, _, _ in top]
        assert not [s for _, s, _ in top if "/" in s and s.endswith("⟩")]
