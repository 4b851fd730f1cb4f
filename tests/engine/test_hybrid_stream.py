"""The residual stream of hybrids and recurrent models (attnviz.explain.stream): the logit lens and
patching over ``residual`` / ``blocks`` on every tiny hybrid and pure state-space model, each
against an oracle written here with plain torch hooks on transformers' own modules."""

from __future__ import annotations

import hybrids_tiny
import numpy as np
import pytest
import torch

import attnviz
from attnviz.explain.blocks import Unsupported
from attnviz.explain.stream import read_stream

CLEAN = "the river bank was steep and the water"
CORRUPT = "the money bank was steep and the water"  # one token differs
ATOL = 1e-4  # fp32: logits of hand-written runs against attnviz's
LAST = 4  # positions per row the oracle patches by hand (one forward each)
MODELS = [
    "qwen3_5_text", "qwen3_next", "bamba", "falcon_h1", "zamba2", "kimi_linear", "lfm2",
    "mamba", "mamba2", "rwkv", "falcon_mamba",
]  # fmt: skip
# Falcon-H1 with its μP multipliers away from 1 (the tiny config's defaults are all 1)
MUP = {
    "lm_head_multiplier": 0.37,
    "ssm_out_multiplier": 0.6,
    "attention_out_multiplier": 1.7,
    "embedding_multiplier": 2.0,
    "mlp_multipliers": (0.8, 1.3),
}
# The oracle's own map of each model: its blocks, its final norm, each part's module (by the
# attribute names in transformers' modeling files, not through attnviz)
PARTS = {
    "qwen3_5_text": {"attention": "self_attn", "gated_delta": "linear_attn", "mlp": "mlp"},
    "qwen3_next": {"attention": "self_attn", "gated_delta": "linear_attn", "mlp": "mlp"},
    "bamba": {"attention": "self_attn", "mamba2": "mamba", "mlp": "feed_forward"},
    "falcon_h1": {"attention": "self_attn", "mamba2": "mamba", "mlp": "feed_forward"},
    "kimi_linear": {"attention": "self_attn", "kimi_delta": "self_attn", "mlp": "mlp"},
    "lfm2": {"attention": "self_attn", "short_conv": "conv", "mlp": "feed_forward"},
    "mamba": {"mamba": "mixer"},
    "mamba2": {"mamba2": "mixer"},
    "rwkv": {"rwkv": "attention", "mlp": "feed_forward"},
}


def _loaded(model_type):
    return (
        hybrids_tiny.loaded(model_type, **MUP)
        if model_type == "falcon_h1"
        else hybrids_tiny.loaded(model_type)
    )


def _blocks(model):
    base = model.base_model
    return list(getattr(base, "layers", None) or base.blocks)


def _final_norm(model):
    base = model.base_model
    for name in ("norm", "final_layernorm", "norm_f", "ln_out", "embedding_norm"):
        if isinstance(getattr(base, name, None), torch.nn.Module):
            return getattr(base, name)
    raise AssertionError("no final norm")


def _ids(lm, text):
    return attnviz.tokenize(lm, text)[0]


def _run(model, ids, *, pre=None, post=None):
    """Last-position logits of ``ids``; ``pre`` = (block, position, vector) replaces a block's
    input there, ``post`` = (module, position, vector) a module's output there; records every
    block's input and every module's output when given dicts to fill instead."""
    handles = []
    try:
        if isinstance(pre, dict):

            def keep_input(b):
                return lambda _m, a, kw: pre.__setitem__(b, (a[0] if a else kw["hidden_states"])[0].clone())

            for b, blk in enumerate(_blocks(model)):
                handles.append(blk.register_forward_pre_hook(keep_input(b), with_kwargs=True))
        elif pre is not None:
            blk, pos, vec = pre

            def swap(_m, a, kw):
                x = (a[0] if a else kw["hidden_states"]).clone()
                x[0, pos] = vec
                return ((x, *a[1:]), kw) if a else (a, {**kw, "hidden_states": x})

            handles.append(blk.register_forward_pre_hook(swap, with_kwargs=True))
        if isinstance(post, dict):

            def keep_output(m, _a, out):
                post[id(m)] = (out if torch.is_tensor(out) else out[0])[0].clone()

            for mod in post.get("modules", []):
                handles.append(mod.register_forward_hook(keep_output))
        elif post is not None:
            mod, pos, vec = post

            def put(_m, _a, out):
                y = (out if torch.is_tensor(out) else out[0]).clone()
                y[0, pos] = vec
                return y if torch.is_tensor(out) else (y, *out[1:])

            handles.append(mod.register_forward_hook(put))
        with torch.no_grad():
            return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
    finally:
        for h in handles:
            h.remove()


def _run_hooked(model, ids, module, pre_hook, **run_kwargs):
    """`_run` with ``pre_hook`` a forward pre-hook on ``module`` for that one run."""
    handle = module.register_forward_pre_hook(pre_hook)
    try:
        return _run(model, ids, **run_kwargs)
    finally:
        handle.remove()


@pytest.mark.parametrize("model_type", MODELS)
def test_the_logit_lens_is_the_final_norm_and_head_at_each_block_boundary(model_type):
    """Row b of the lens = softmax(lm_head(final_norm(input of block b))) (× Falcon-H1's
    lm_head_multiplier), the last row the model's own prediction; a hand-hooked oracle."""
    lm = _loaded(model_type)
    model, ids = lm.model, _ids(lm, CLEAN)
    inputs: dict = {}
    finals: list = []
    own = _run_hooked(
        model, ids, _final_norm(model), lambda _m, a: finals.append(a[0][0].clone()), pre=inputs
    )
    rows = [inputs[b] for b in range(len(inputs))] + [finals[0]]
    multiplier = getattr(model.config, "lm_head_multiplier", 1.0)
    with torch.no_grad():
        head = model.get_output_embeddings()
        want = torch.stack([head(_final_norm(model)(x[None]))[0] * multiplier for x in rows]).float()
    lens = attnviz.logit_lens(lm, CLEAN, k=3)
    assert lens.n_rows == len(_blocks(model)) + 1
    probs = want.softmax(-1)[:, list(lens.positions)]  # (rows, positions, vocab)
    pred = want[-1, list(lens.positions)].argmax(-1)
    assert torch.equal(torch.as_tensor(lens.predicted), pred) and int(pred[-1]) == int(own.argmax())
    got = torch.as_tensor(lens.prob)
    np.testing.assert_allclose(
        got, probs.gather(-1, pred.expand(len(rows), -1)[..., None])[..., 0], atol=1e-5
    )
    np.testing.assert_allclose(lens.top_probs[..., 0], probs.max(-1).values, atol=1e-5)


def test_falcon_h1_branches_are_read_each_on_its_own_with_their_mup_multipliers():
    """Attention ‖ Mamba-2 in every block: each branch's part of the stream carries its own
    multiplier (ssm_out_multiplier, attention_out_multiplier), read from the tensors."""
    lm = _loaded("falcon_h1")
    st = read_stream(lm, _ids(lm, CLEAN))
    assert st.parts == ("attention", "mamba2", "mlp") and not any(st.problem) and not st.unembed_problem
    for scales in st.scales:
        assert scales["mamba2"] == pytest.approx(MUP["ssm_out_multiplier"], rel=1e-5)
        assert scales["attention"] == pytest.approx(MUP["attention_out_multiplier"], rel=1e-5)
    for b in range(st.n_layers):
        total = st.stream[b] + sum(st.added[b].values())
        assert (total - st.stream[b + 1]).abs().max() <= 1e-5


@pytest.mark.parametrize(
    "model_type",
    ["qwen3_5_text", "falcon_h1", "mamba", "rwkv", pytest.param("kimi_linear", marks=pytest.mark.slow)],
)
def test_residual_and_blocks_patching_equal_hand_patched_runs(model_type):
    """The cells of over='residual' and over='blocks' (each branch of each block on its own) at the
    last positions are the patched runs written here with plain hooks (fp32, ≤ 1e-4); a part a
    block lacks is NaN."""
    lm = _loaded(model_type)
    model, clean, corrupt = lm.model, _ids(lm, CLEAN), _ids(lm, CORRUPT)
    blocks = _blocks(model)
    inputs: dict = {}
    _run(model, clean, pre=inputs)
    res = attnviz.patch(lm, CLEAN, CORRUPT, over="residual")
    for b in range(len(blocks)):
        for i, p in list(enumerate(res.positions))[-LAST:]:
            src = res.pairing.source_of(p)  # the prompts' aligned positions (they differ in length)
            logits = _run(model, corrupt, pre=(blocks[b], p, inputs[b][src]))
            assert abs(float(logits[res.answer] - logits[res.wrong]) - res.raw[b, i]) <= ATOL
    res = attnviz.patch(lm, CLEAN, CORRUPT, over="blocks")
    names = PARTS[model_type]
    outputs: dict = {
        "modules": [getattr(blk, n) for blk in blocks for n in set(names.values()) if hasattr(blk, n)]
    }
    _run(model, clean, post=outputs)
    mixers = lm.layout.mixers
    for b, blk in enumerate(blocks):
        for j, part in enumerate(res.parts):
            has = part in mixers[b] or (part == "mlp" and hasattr(blk, names["mlp"]))
            if not has:
                assert np.isnan(res.raw[b, j]).all(), (b, part)
                continue
            mod = getattr(blk, names[part])
            for i, p in list(enumerate(res.positions))[-LAST:]:
                src = res.pairing.source_of(p)
                logits = _run(model, corrupt, post=(mod, p, outputs[id(mod)][src]))
                assert abs(float(logits[res.answer] - logits[res.wrong]) - res.raw[b, j, i]) <= ATOL


def test_attribution_patching_runs_on_a_hybrids_blocks_and_its_top_cells_are_real_patches():
    lm = _loaded("qwen3_5_text")
    est = attnviz.attribution_patch(lm, CLEAN, CORRUPT, over="blocks", verify=4)
    real = attnviz.patch(lm, CLEAN, CORRUPT, over="blocks")
    assert est.estimate and est.parts == real.parts and len(est.verified) == 4
    for idx, (_, checked) in est.verified.items():
        assert checked == pytest.approx(float(real.values[idx]), abs=1e-4)


def test_the_refusals_on_hybrids_say_what_is_missing_and_what_runs():
    """The old reason ("not a sum of per-token parts") was untrue: gates frozen, a mixer is one."""
    lm = _loaded("qwen3_5_text")
    with pytest.raises(Unsupported) as err:
        attnviz.explain.trace(lm, CLEAN)
    assert "per-token parts" not in str(err.value) and "per-head parts of these mixers" in str(err.value)
    assert "logit lens and patching over 'residual' and 'blocks'" in str(err.value)
    with pytest.raises(Unsupported, match="two head-bearing branches side by side"):
        attnviz.patch(_loaded("falcon_h1"), CLEAN, CORRUPT, over="heads")
    with pytest.raises(Unsupported, match=r"mixes per channel \(mamba\): it has no heads"):
        attnviz.patch(_loaded("mamba"), CLEAN, CORRUPT, over="heads_by_position")


def test_the_patching_figure_names_a_hybrids_parts():
    from attnviz.figures.patching import patching_view

    lm = _loaded("falcon_h1")
    res = attnviz.patch(lm, CLEAN, CORRUPT, over="blocks")
    fig = patching_view(res)
    rows = [str(t) for t in fig.data[0].y]
    assert "L0 mamba2" in rows and "L1 attention" in rows and "L1 mlp" in rows


@pytest.mark.parametrize("model_type", [m for m in MODELS if m not in ("rwkv", "zamba2")])
def test_block_attribution_parts_sum_to_the_logit(model_type):
    """Embedding + every block part (each branch on its own) + biases = the model's logit at the
    frozen final-norm scale (fp32 stream, float64 sums)."""
    from attnviz.explain.block_attribution import block_attribution

    lm = _loaded(model_type)
    att = block_attribution(lm, CLEAN)
    own = _run(lm.model, _ids(lm, CLEAN))
    assert att.target == int(own.argmax()) and att.logit == pytest.approx(float(own.max()), abs=1e-5)
    assert abs(att.error) <= 1e-4 * max(1.0, abs(att.logit))
    have = {(part, b) for part, b, _ in att.ranking() if b >= 0}
    assert have == {(p, b) for b, kinds in enumerate(lm.layout.mixers) for p in kinds} | {
        ("mlp", b) for b in range(att.values.shape[0]) if "mlp" in att.parts
    }


def test_a_branchs_direct_effect_is_its_output_through_the_frozen_final_norm_by_hand():
    """Falcon-H1 (μP): the Mamba-2 branch of block 1 = ((w · m_ssm · o / rms(x)) · W_U[target]) ·
    m_head, with o the mixer module's output and x the final norm's input at the last token."""
    from attnviz.explain.block_attribution import block_attribution

    lm = _loaded("falcon_h1")
    model = lm.model
    blk = _blocks(model)[1]
    seen: dict = {"modules": [blk.mamba]}
    finals: list = []
    norm = _final_norm(model)
    _run_hooked(model, _ids(lm, CLEAN), norm, lambda _m, a: finals.append(a[0][0, -1].clone()), post=seen)
    x, o = finals[0].double(), seen[id(blk.mamba)][-1].double()
    rms = torch.sqrt(x.pow(2).mean() + norm.variance_epsilon)
    att = block_attribution(lm, CLEAN)
    w_u = model.get_output_embeddings().weight[att.target].double()
    want = (
        float((norm.weight.double() * MUP["ssm_out_multiplier"] * o / rms) @ w_u) * MUP["lm_head_multiplier"]
    )
    assert att.values[1, att.parts.index("mamba2")] == pytest.approx(want, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize(("model_type", "why"), [("rwkv", "pre_ln"), ("zamba2", "shared block")])
def test_block_attribution_refuses_a_block_that_is_not_a_sum_of_its_parts(model_type, why):
    from attnviz.explain.block_attribution import block_attribution

    with pytest.raises(attnviz.AttnvizError, match=why):
        block_attribution(_loaded(model_type), CLEAN)


def test_a_mixer_heads_direct_effect_is_its_slice_through_out_proj_by_hand():
    """Falcon-H1's Mamba-2 (SSD) in block 1, head h: (W_out[:, h] · x_h) · m_ssm through the frozen
    final RMSNorm and the LM head (× m_head), x the out_proj input (gates, norm at their forward
    values) read with a plain pre-hook; the heads sum to the mixer's part."""
    from attnviz.explain.block_attribution import block_attribution

    lm = _loaded("falcon_h1")
    model = lm.model
    proj = _blocks(model)[1].mamba.out_proj
    seen: list = []
    finals: list = []
    norm = _final_norm(model)
    hooks = [
        proj.register_forward_pre_hook(lambda _m, a: seen.append(a[0][0, -1].clone())),
        norm.register_forward_pre_hook(lambda _m, a: finals.append(a[0][0, -1].clone())),
    ]
    try:
        _run(model, _ids(lm, CLEAN))
    finally:
        for h in hooks:
            h.remove()
    att = block_attribution(lm, CLEAN)
    heads = att.heads[(1, "mamba2")]
    n_heads = model.config.mamba_n_heads
    d = proj.in_features // n_heads
    x, w = seen[0].double(), proj.weight.double()
    rms = torch.sqrt(finals[0].double().pow(2).mean() + norm.variance_epsilon)
    w_u = model.get_output_embeddings().weight[att.target].double()
    for h in range(n_heads):
        write = w[:, h * d : (h + 1) * d] @ x[h * d : (h + 1) * d] * MUP["ssm_out_multiplier"]
        want = float((norm.weight.double() * write / rms) @ w_u) * MUP["lm_head_multiplier"]
        assert heads[h] == pytest.approx(want, rel=1e-4, abs=1e-7)
    assert heads.sum() == pytest.approx(att.values[1, att.parts.index("mamba2")], abs=1e-6)


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "bamba", "kimi_linear", "mamba2"])
def test_per_head_mixers_are_split_by_head_and_per_channel_ones_are_not(model_type):
    from attnviz.explain.block_attribution import block_attribution

    lm = _loaded(model_type)
    att = block_attribution(lm, CLEAN)
    per_head = {(b, k) for b, kinds in enumerate(lm.layout.mixers) for k in kinds if k != "attention"}
    assert set(att.heads) == per_head
    for (b, part), heads in att.heads.items():
        assert heads.sum() == pytest.approx(att.values[b, att.parts.index(part)], abs=1e-5)
    assert not block_attribution(_loaded("mamba"), CLEAN).heads  # Mamba-1: per channel, one component


@pytest.mark.parametrize(("model_type", "proj_of"), [("qwen3_5_text", "linear_attn"), ("mamba2", "mixer")])
def test_mixer_head_patching_equals_a_hand_patched_out_proj_input(model_type, proj_of):
    """over='heads_by_position' on a mixer block: head h's slice of out_proj's input (its output
    before out_proj, gates and norm applied) at one position copied from the clean run, written
    here with plain pre-hooks; softmax blocks' heads as before; a head a block lacks is NaN."""
    lm = _loaded(model_type)
    model, clean, corrupt = lm.model, _ids(lm, CLEAN), _ids(lm, CORRUPT)
    res = attnviz.patch(lm, CLEAN, CORRUPT, over="heads_by_position")
    proj = getattr(_blocks(model)[0], proj_of).out_proj
    kept: list = []
    _run_hooked(model, clean, proj, lambda _m, a: kept.append(a[0][0].clone()))
    n_heads = res.values.shape[1]
    d = proj.in_features // n_heads
    for h in range(n_heads):
        for i, p in list(enumerate(res.positions))[-2:]:
            src = kept[0][res.pairing.source_of(p), h * d : (h + 1) * d]

            def swap(_m, a, p=p, h=h, src=src):
                x = a[0].clone()
                x[0, p, h * d : (h + 1) * d] = src
                return (x, *a[1:])

            logits = _run_hooked(model, corrupt, proj, swap)
            assert abs(float(logits[res.answer] - logits[res.wrong]) - res.raw[0, h, i]) <= ATOL
    est = attnviz.attribution_patch(lm, CLEAN, CORRUPT, over="heads", verify=2)
    for idx, (_, checked) in est.verified.items():
        real = attnviz.patch(lm, CLEAN, CORRUPT, over="heads")
        assert checked == pytest.approx(float(real.values[idx]), abs=1e-4)


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_mixer_head_ablation_equals_a_hand_ablated_out_proj_input(mode):
    """Qwen3.5's gated delta block 0, head 1: its slice of out_proj's input set to 0 (or its mean
    over the positions) at every position, by a plain pre-hook; the logit of the prediction."""
    from attnviz.explain.mixer_ablation import ablate_mixer_heads

    lm = _loaded("qwen3_5_text")
    model, ids = lm.model, _ids(lm, CLEAN)
    proj = _blocks(model)[0].linear_attn.out_proj
    n_heads = lm.model.config.linear_num_value_heads
    d = proj.in_features // n_heads
    seen: list = []
    own = _run_hooked(model, ids, proj, lambda _m, a: seen.append(a[0][0].clone()))
    fill = 0.0 if mode == "zero" else seen[0][:, d : 2 * d].mean(0)

    def ablate(_m, a):
        x = a[0].clone()
        x[0, :, d : 2 * d] = fill
        return (x, *a[1:])

    hand = _run_hooked(model, ids, proj, ablate)
    got = ablate_mixer_heads(lm, CLEAN, [(0, 1)], mode=mode)
    top = int(own.argmax())
    assert got.target == top and got.logit_before == pytest.approx(float(own[top]), abs=1e-5)
    assert got.logit_after == pytest.approx(float(hand[top]), abs=1e-5) and got.kl >= 0
    with pytest.raises(attnviz.AttnvizError, match="no per-head mixer"):
        ablate_mixer_heads(lm, CLEAN, [(1, 0)])  # block 1 is softmax attention
