"""The trace's tensors are the model's own: the routes oracle (tests/tiny_explain.dense_graph)
reads the trace's streams, values, W_O, biases and norms, so each of them is tied here to what
transformers' own modules computed or hold (hidden states, hooks on the output projection, the
MLP and the final norm, the weights), never to another attnviz computation."""

from __future__ import annotations

import pytest
import tiny_explain as TE
import torch

import attnviz
from attnviz.explain import trace
from attnviz.explain.residual import final_norm

OUT_PROJ = ("o_proj", "dense", "c_proj", "out_proj")


def modules(lm, layer: int):
    """(the layer's block, its attention, its output projection) as transformers built them."""
    name = lm.probe.sites["self"][layer].module_name
    attn = lm.model.get_submodule(name)
    block = lm.model.get_submodule(name.rsplit(".", 1)[0])
    return block, attn, next(getattr(attn, n) for n in OUT_PROJ if hasattr(attn, n))


def hooked_run(lm, ids: list[int]):
    """The model's own forward with hooks: hidden states, final-norm input, and per layer the
    output projection's input / output and the MLP's output."""
    seen: dict = {}
    hooks = []
    n = lm.model.config.get_text_config().num_hidden_layers
    for layer in range(n):
        block, _, proj = modules(lm, layer)
        hooks.append(
            proj.register_forward_pre_hook(lambda _m, a, i=layer: seen.__setitem__(("z", i), a[0][0]))
        )
        hooks.append(proj.register_forward_hook(lambda _m, _a, o, i=layer: seen.__setitem__(("o", i), o[0])))
        hooks.append(
            block.mlp.register_forward_hook(lambda _m, _a, o, i=layer: seen.__setitem__(("mlp", i), o[0]))
        )
    hooks.append(
        final_norm(lm)[1].register_forward_pre_hook(lambda _m, a: seen.__setitem__("final", a[0][0]))
    )
    try:
        with torch.inference_mode():
            out = lm.model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return out, seen


@pytest.mark.parametrize("name", ["llama-gqa", "gemma2", "gpt_neox-parallel", "qwen2-bias"])
def test_every_tensor_the_routes_oracle_reads_is_the_models_own(name):
    """Caught: V doubled and W_O halved together (every product the engine checks itself, and the
    routes oracle reading the same trace, still agreed: the routes tests passed)."""
    lm = TE.loaded(name)
    tr = trace(lm, TE.TEXT)
    ids = list(tr.tokens.ids)
    out, seen = hooked_run(lm, ids)
    L, d = tr.n_layers, lm.layout.head_dim
    close = dict(atol=2e-5, rtol=1e-4)
    for layer in range(L):
        torch.testing.assert_close(tr.stream[layer].float(), out.hidden_states[layer][0].float(), **close)
    torch.testing.assert_close(tr.stream[L].float(), seen["final"].float(), **close)
    eager = attnviz.extract_ids(lm, ids, path="eager")
    for layer in range(L):
        block, _, proj = modules(lm, layer)
        probs = torch.from_numpy(eager.layer(layer)).float()  # (heads, N, N): the model's own α
        z = torch.einsum("hqk,hkd->qhd", probs, tr.values(layer).float()).reshape(len(ids), -1)
        torch.testing.assert_close(z, seen[("z", layer)].float(), **close)  # Σ_j α v_j = W_O's input
        w = proj.weight.detach().float()
        w = w.T if type(proj).__name__ == "Conv1D" else w  # (d_model, heads * d_head)
        for h in range(tr.n_heads):
            torch.testing.assert_close(tr.w_o(lm, layer)[h], w[:, h * d : (h + 1) * d])
        bias = proj.bias
        assert (tr.out_bias[layer] is None) == (bias is None)
        if bias is not None:
            torch.testing.assert_close(tr.out_bias[layer], bias.detach().float())
        post_mlp = getattr(block, "post_feedforward_layernorm", None)
        mlp = seen[("mlp", layer)] if post_mlp is None else post_mlp(seen[("mlp", layer)][None])[0]
        torch.testing.assert_close(tr.mlp_added[layer].float(), mlp.float(), **close)
        o = seen[("o", layer)]
        if tr.attn_norm[layer] is not None:  # Gemma 2: the norm between the heads and the stream
            o = block.post_attention_layernorm(o[None])[0]
            parts = torch.einsum("hmd,qhd->qm", tr.w_o(lm, layer), z.reshape(len(ids), tr.n_heads, d))
            heads = tr.attn_norm[layer].apply(parts, slice(None))
            const = tr.attn_norm[layer].constant
            torch.testing.assert_close(heads + (0 if const is None else const), o.float(), **close)
        torch.testing.assert_close(tr.attn_added[layer].float(), o.float(), **close)
