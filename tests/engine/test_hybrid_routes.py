"""Routes and node inspection on hybrids and recurrent models (attnviz.explain.block_routes): every
mixing branch's edges c_{t,s}, summed over sources, are what the branch adds to the stream, against
an oracle written here with plain torch hooks on transformers' own modules; the routes' scores are
the literal definition; node inspection of a mixer head is its write through out_proj by hand."""

from __future__ import annotations

import hybrids_tiny
import pytest
import torch

import attnviz
from attnviz.explain import block_routes, route_parts
from attnviz.explain.block_trace import block_trace
from attnviz.explain.routes import threshold_renormalise

TEXT = "the river bank was steep and the water ran fast past the old mill"
REL = 1e-4  # fp32: relative to the branch output's largest entry
# Falcon-H1 with its μP multipliers away from 1: the edges carry the branch's scalar into the stream
MUP = {"ssm_out_multiplier": 0.6, "attention_out_multiplier": 1.7, "lm_head_multiplier": 0.37}
MULTIPLIER = {"falcon_h1": {"mamba2": 0.6, "attention": 1.7}}
# The oracle's own map: each mixing branch's module by its attribute in transformers' modeling file
BRANCHES = {
    "qwen3_5_text": {"gated_delta": "linear_attn", "attention": "self_attn"},
    "qwen3_next": {"gated_delta": "linear_attn", "attention": "self_attn"},
    "bamba": {"mamba2": "mamba", "attention": "self_attn"},
    "falcon_h1": {"mamba2": "mamba", "attention": "self_attn"},
    "kimi_linear": {"kimi_delta": "self_attn", "attention": "self_attn"},
    "lfm2": {"short_conv": "conv", "attention": "self_attn"},
    "mamba": {"mamba": "mixer"},
    "mamba2": {"mamba2": "mixer"},
    "falcon_mamba": {"mamba": "mixer"},
    "rwkv": {"rwkv": "attention"},
}
FAST = ["qwen3_5_text", "falcon_h1", "bamba", "lfm2", "mamba", "mamba2", "rwkv"]
SLOW = ["qwen3_next", "kimi_linear", "falcon_mamba"]


def _loaded(model_type):
    return (
        hybrids_tiny.loaded(model_type, **MUP)
        if model_type == "falcon_h1"
        else hybrids_tiny.loaded(model_type)
    )


def _hooked_outputs(model, ids, model_type):
    """{(block, branch): (N, d_model) output} from one plain forward with torch hooks (no attnviz)."""
    base = model.base_model
    blocks = list(getattr(base, "layers", None) or base.blocks)
    got, handles = {}, []
    for b, block in enumerate(blocks):
        for branch, attr in BRANCHES[model_type].items():
            module = getattr(block, attr, None)
            if module is None:
                continue

            def keep(_m, _a, out, key=(b, branch)):
                got[key] = (out[0] if isinstance(out, tuple) else out)[0].detach().float()

            handles.append(module.register_forward_hook(keep))
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return got


@pytest.mark.parametrize("model_type", FAST + [pytest.param(m, marks=pytest.mark.slow) for m in SLOW])
def test_each_branch_edges_sum_to_its_hooked_output(model_type):
    lm = _loaded(model_type)
    ids = attnviz.tokenize(lm, TEXT)[0]
    tr = block_trace(lm, ids)
    assert not any(tr.problems), tr.problems
    hooked = _hooked_outputs(lm.model, ids, model_type)
    seen = 0
    for b, parts in enumerate(tr.parts):
        for branch, part in parts.items():
            if (b, branch) not in hooked:  # kimi_linear names both kinds self_attn: the one there
                continue
            want = hooked[(b, branch)] * MULTIPLIER.get(model_type, {}).get(branch, 1.0)
            for t in (0, len(ids) // 2, len(ids) - 1):
                edges = part.vectors(t)  # (heads, t + 1, d_model): c_{t,s} per head and source
                assert edges.shape[:2] == (part.n_heads, t + 1)
                # Σ_s c_{t,s} + rest (out_proj's bias; LFM2's conv bias C_t ⊙ b); SSD's and Mamba-1's
                # D ⊙ x_t are token t's own, on the self edge
                total = edges.sum(dim=(0, 1)) + part.rest(t)
                torch.testing.assert_close(part.sums([t])[0], edges.sum(dim=(0, 1)), atol=1e-5, rtol=1e-4)
                assert (total - want[t]).abs().max() <= REL * max(1.0, float(want[t].abs().max())), (
                    b,
                    branch,
                    t,
                )
                seen += 1
    assert seen >= 3 * len(tr.parts)


def test_the_graph_is_the_dense_definition_on_a_hybrid():
    """Every edge of Falcon-H1's routes (attention ‖ Mamba-2 side by side, μP multipliers), built
    here densely from each part's literal vectors, equals information_flow's."""
    lm = _loaded("falcon_h1")
    tr = block_trace(lm, attnviz.tokenize(lm, TEXT)[0])
    thr = 0.03
    graph = attnviz.information_flow(lm, tr, threshold=thr)
    mine = {(e.layer, e.kind, e.part, e.source, e.target): e.weight for e in graph.edges}
    dense = _dense_edges(tr, thr)
    reached, kept = {(tr.n_layers, tr.n_tokens - 1, "in")}, {}
    for key in sorted(dense, key=lambda k: -(k[4][0] + (0.5 if k[4][2] == "mid" else 0))):
        if key[4] in reached:
            kept[key] = dense[key]
            reached.add(key[3])
    as_tuples = {
        (k[0], k[1], k[2], (k[3].layer, k[3].token, k[3].stage), (k[4].layer, k[4].token, k[4].stage)): w
        for k, w in mine.items()
    }
    assert set(as_tuples) == set(kept)
    for key, w in kept.items():
        assert abs(as_tuples[key] - w) < 1e-5, key
    assert any(k[1] == "mixer" for k in kept) and any(k[1] == "attention" for k in kept)


def _l1(whole, parts):
    return (whole.abs().sum(-1) - (whole - parts).abs().sum(-1)).clamp(min=0)


def _dense_edges(tr, thr):
    """{(layer, kind, part, source, target): weight} of every block and target, literally."""
    edges = {}
    for layer in range(tr.n_layers):
        for t in range(tr.n_tokens):
            mid = tr.mixed(layer, [t])[0]
            nxt = tr.next_stream(layer, [t])[0]
            imp_f = _l1(nxt, torch.stack([mid, tr.mlp[layer][t]]))
            _, c_f = threshold_renormalise(torch.zeros(1, 0, 0), (imp_f / imp_f.sum())[None], thr)
            for kind, c in zip(("residual", "ffn"), c_f[0], strict=True):
                if c > thr:
                    edges[(layer, kind, "", (layer, t, "mid"), (layer + 1, t, "in"))] = float(c)
            names = list(tr.parts[layer])
            imps = [_l1(mid, tr.parts[layer][n].vectors(t)) for n in names]  # (heads, t + 1) each
            imp_r = _l1(mid, tr.residual_in[layer][t][None])
            total = sum(float(i.sum()) for i in imps) + float(imp_r.sum())
            cat = torch.cat(imps)[None] / total
            c_a, c_r = threshold_renormalise(cat, imp_r[None] / total, thr)
            if c_r[0, 0] > thr:
                edges[(layer, "residual", "", (layer, t, "in"), (layer, t, "mid"))] = float(c_r[0, 0])
            for name, c in zip(names, c_a[0].split([tr.parts[layer][n].n_heads for n in names]), strict=True):
                w = c.sum(0)
                for s in torch.nonzero(w > thr).flatten().tolist():
                    kind = "attention" if name == "attention" else "mixer"
                    edges[(layer, kind, name, (layer, s, "in"), (layer, t, "mid"))] = float(w[s])
    return edges


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "mamba"])
def test_the_scores_equal_the_literal_definition(model_type):
    """Signed parts (a mixer's A is not a probability) scored without making every vector equal
    max(‖w‖₁ − ‖w − c‖₁, 0) made literally, including the parts that flip a sign of w."""
    lm = _loaded(model_type)
    tr = block_trace(lm, attnviz.tokenize(lm, TEXT)[0])
    targets = [3, 9, tr.n_tokens - 1]
    for layer, parts in enumerate(tr.parts):
        whole = tr.mixed(layer, targets) * 0.05  # a small whole: many parts flip a component
        for part in parts.values():
            got = part.importances(whole, targets, max(targets) + 1)
            for i, t in enumerate(targets):
                literal = _l1(whole[i], part.vectors(t))  # (heads, t + 1)
                torch.testing.assert_close(got[i, :, : t + 1], literal, atol=1e-5, rtol=1e-4)
                assert not got[i, :, t + 1 :].any()


def test_zamba2_routes_refuse_with_the_shared_block_named():
    lm = hybrids_tiny.loaded("zamba2")
    with pytest.raises(attnviz.AttnvizError, match="shared attention block"):
        attnviz.information_flow(lm, TEXT)


def test_node_inspection_of_a_mixer_head_is_its_write_through_out_proj():
    """A Gated DeltaNet head's write at a token, by hand: its slice of out_proj's input (read by a
    plain hook) through its columns of W_out; projected as W_U · N_f(v)."""
    lm = _loaded("qwen3_5_text")
    ids = attnviz.tokenize(lm, TEXT)[0]
    tr = block_trace(lm, ids)
    proj = lm.model.model.layers[0].linear_attn.out_proj
    inputs = {}
    handle = proj.register_forward_pre_hook(lambda _m, a: inputs.setdefault("x", a[0][0].detach()))
    try:
        with torch.no_grad():
            lm.model(torch.tensor([ids]))
    finally:
        handle.remove()
    heads = tr.parts[0]["gated_delta"].n_heads
    t, h = len(ids) - 2, 1
    d = inputs["x"].shape[-1] // heads
    by_hand = proj.weight[:, h * d : (h + 1) * d].float() @ inputs["x"][t, h * d : (h + 1) * d].float()
    node = attnviz.explain.node_writes(lm, tr, 0, t, part="gated_delta", head=h)
    by_hand = by_hand.detach()
    assert abs(node.norm - float(by_hand.norm())) <= 1e-4 * max(1.0, float(by_hand.norm()))
    x = tr.stream.stream[-1][t].float()
    with torch.no_grad():  # an RMSNorm at its frozen scale is y_i / x_i per component
        per_component = lm.model.model.norm(x[None])[0] / x
    logits = lm.model.lm_head.weight.float() @ (per_component * by_hand)
    torch.testing.assert_close(node.logits, logits, atol=1e-4, rtol=1e-4)
    whole = attnviz.explain.node_writes(lm, tr, 0, t, part="gated_delta")
    parts = sum(
        attnviz.explain.node_writes(lm, tr, 0, t, part="gated_delta", head=k).logits for k in range(heads)
    )
    bias = proj.bias
    assert bias is None
    torch.testing.assert_close(whole.logits, parts, atol=1e-4, rtol=1e-4)


def test_a_per_channel_mixer_has_no_heads_to_inspect():
    lm = _loaded("mamba")
    tr = block_trace(lm, attnviz.tokenize(lm, TEXT)[0])
    with pytest.raises(attnviz.AttnvizError, match="no head 0 of a mamba branch"):
        attnviz.explain.node_writes(lm, tr, 0, 3, part="mamba", head=0)
    assert attnviz.explain.node_writes(lm, tr, 0, 3, part="mamba").norm > 0
    assert block_routes.refusal(tr) == ""
    assert route_parts.ChannelPart is type(tr.parts[0]["mamba"])


@pytest.mark.parametrize("model_type", FAST + [pytest.param(m, marks=pytest.mark.slow) for m in SLOW])
def test_routes_reach_mixer_edges_and_draw_on_every_model(model_type):
    lm = _loaded(model_type)
    graph = attnviz.information_flow(lm, TEXT, threshold=0.01)
    kinds = {e.part for e in graph.edges if e.kind == "mixer"}
    assert kinds and kinds <= set(BRANCHES[model_type]) - {"attention"}
    for e in graph.edges:  # a mixer edge's weight: Σ of its heads' shares (a per-channel mixer: one)
        if e.kind == "mixer":
            assert abs(sum(e.heads) - e.weight) < 1e-5
            assert (len(e.heads) == 1) == (e.part in ("mamba", "rwkv", "short_conv")), e
    fig = attnviz.flow_view(graph)
    assert any(t.name == "mixer" for t in fig.data)
    assert {graph.writer(n)[1] for n in graph.nodes if n.layer > 0} <= {
        *BRANCHES[model_type],
        "ffn",
        "mixing",
    }


@pytest.mark.parametrize("model_type", ["mamba2", "qwen3_5_text"])
def test_bf16_models_pass_their_checks_and_draw_routes(model_type):
    """In bf16 (as on a GPU) every branch's edges still add up within the half-precision tolerance;
    Mamba's final norm returns float32 there, cast to the LM head's dtype as the model does."""
    import copy

    import tiny

    model = copy.deepcopy(hybrids_tiny.model(model_type)).to(torch.bfloat16)
    lm = attnviz.wrap_model(model, tiny.tokenizer(), spec=f"bf16-{model_type}")
    tr = block_trace(lm, attnviz.tokenize(lm, TEXT)[0])
    assert not any(tr.problems) and not tr.unembed_problem, (tr.problems, tr.unembed_problem)
    assert any(e.kind == "mixer" for e in attnviz.information_flow(lm, tr, threshold=0.01).edges)


def test_a_trace_that_would_not_fit_is_a_message(monkeypatch):
    from attnviz import limits

    lm = _loaded("mamba")
    monkeypatch.setattr(limits, "free_bytes", lambda device: 1 << 10)
    with pytest.raises(
        attnviz.AttnvizError, match=r"tracing .* tokens through every block's mixers .* shorter text"
    ):
        block_trace(lm, TEXT)


def test_a_clicked_node_of_falcon_h1_writes_both_branches_by_hand():
    """Falcon-H1's node after a block's mixing is written by its attention ‖ Mamba-2 together
    ("mixing"): the hooked branch outputs times their μP multipliers, at that token."""
    lm = _loaded("falcon_h1")
    ids = attnviz.tokenize(lm, TEXT)[0]
    tr = block_trace(lm, ids)
    graph = attnviz.information_flow(lm, tr, threshold=0.01)
    hooked = _hooked_outputs(lm.model, ids, "falcon_h1")
    mids = [n for n in graph.nodes if n.stage == "mid"]
    assert mids and {graph.writer(n) for n in mids} == {(n.layer, "mixing") for n in mids}
    for node in mids:
        got = attnviz.explain.node_writes(lm, tr, node.layer, node.token, part="mixing")
        want = sum(hooked[(node.layer, b)][node.token] * m for b, m in MULTIPLIER["falcon_h1"].items())
        assert abs(got.norm - float(want.norm())) <= 1e-4 * float(want.norm())


def test_routes_from_a_stream_say_what_to_pass():
    lm = _loaded("mamba")
    with pytest.raises(attnviz.AttnvizError, match="block_trace"):
        attnviz.information_flow(lm, attnviz.explain.stream(lm, TEXT))  # type: ignore[arg-type]
