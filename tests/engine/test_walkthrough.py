"""The textbook run on real layers: every step's shape, parity with the model, counterfactuals."""

import functools

import numpy as np
import pytest
import tiny
import torch
import transformers as tf

import attnviz
from attnviz.reference import SUPPORTED, layer_walkthrough, shape_table
from attnviz.reference.walkthrough import allowed_mask

TEXT = "the financial bank is located on river bank"
TOL = 1e-5  # float32
DECODERS = ["llama-gqa", "qwen3", "gemma2", "gpt2", "mistral-sliding", "qwen2"]
ARCHS = [*DECODERS, "bert"]


@functools.cache
def _qwen2() -> tf.PreTrainedModel:
    """Qwen2: Llama-style with biases on q/k/v (not in tiny.py)."""
    torch.manual_seed(0)
    cfg = tf.Qwen2Config(**tiny.SMALL, num_key_value_heads=2)
    m = tf.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                p.mul_(4.0)
    return m.eval()


def loaded(arch: str) -> attnviz.LoadedModel:
    if arch == "qwen2":
        return attnviz.wrap_model(_qwen2(), tiny.tokenizer("decoder"), spec="tiny-qwen2")
    return tiny.loaded(arch)


@functools.cache
def walk(arch: str, layer: int):
    return layer_walkthrough(loaded(arch), TEXT, layer)


def n_layers(arch: str) -> int:
    return loaded(arch).layout.n_layers


def entropy(p: np.ndarray) -> float:
    """Mean entropy of the rows of (heads, N, N) probabilities, in nats."""
    return float(-(p * np.log(np.where(p > 0, p, 1.0))).sum(-1).mean())


@pytest.mark.parametrize("arch", ARCHS)
def test_parity_every_layer(arch):
    for layer in range(n_layers(arch)):
        wt = walk(arch, layer)
        assert wt.max_abs_diff_probs <= TOL, (arch, layer)
        assert wt.max_abs_diff_output <= TOL, (arch, layer)
        assert wt.max_abs_diff_context <= TOL, (arch, layer)
        if arch != "bert":  # BERT's module gets no mask (nothing is blocked)
            assert wt.mask_matches_model is True, (arch, layer)


@pytest.mark.parametrize("arch", ARCHS)
def test_named_fields_reproduce_the_model_independently(arch):
    """From wt.q / wt.k alone, in NumPy, the eager probabilities come back: the fields are real."""
    lm = loaded(arch)
    eager = attnviz.extract(lm, TEXT, path="eager")
    for layer in range(n_layers(arch)):
        wt = walk(arch, layer)
        G = lm.layout.group_size
        k = np.repeat(wt.k, G, axis=0).astype(np.float64)  # (heads, N, d_head)
        s = wt.q.astype(np.float64) @ k.transpose(0, 2, 1) * wt.scaling
        if wt.softcap is not None:
            s = np.tanh(s / wt.softcap) * wt.softcap
        s = np.where(wt.mask, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        assert np.abs(p - eager.layer(layer)).max() < TOL, (arch, layer)
        # and a different layer's pattern is far away: the comparison can fail
        other = eager.layer((layer + 1) % n_layers(arch))
        assert np.abs(p - other).max() > 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_steps_carry_their_shapes(arch):
    wt = walk(arch, 0)
    lay = wt.layout
    N, nh, nkv, hs = len(wt.tokens), lay.n_heads, lay.n_kv_heads, lay.head_dim
    for s in wt.steps:
        assert s.value.shape == s.shape, s.name
        assert s.description and "{" not in s.description, s.name
    assert len(set(wt.names)) == len(wt.names)
    assert wt.step("x").shape == (1, N, lay.d_model)
    assert wt.step("q_heads").shape == (1, nh, N, hs)
    assert wt.step("k_heads").shape == (1, nkv, N, hs)
    assert wt.step("probs").shape == (1, nh, N, N)
    assert wt.step("concat").shape == (1, N, nh * hs)
    assert wt.step("output").shape == (1, N, lay.d_model)
    assert wt.probs.shape == (nh, N, N) and wt.output.shape == (N, lay.d_model)
    assert np.allclose(wt.probs.sum(-1), 1.0, atol=1e-6)
    assert (wt.probs[:, ~wt.mask] == 0).all()
    with pytest.raises(KeyError, match="no step"):
        wt.step("nope")
    with pytest.raises(ValueError, match="read-only"):
        wt.probs[0, 0, 0] = 1.0  # steps share memory; nobody may change them in place


def test_which_steps_each_architecture_has():
    has = {arch: set(walk(arch, 0).names) for arch in ARCHS}
    rope = {"rope_cos", "rope_sin", "q_rope", "k_rope"}
    assert rope <= has["llama-gqa"] and not rope & has["gpt2"] and not rope & has["bert"]
    assert {"k_repeated", "v_repeated"} <= has["llama-gqa"] and "k_repeated" not in has["gpt2"]
    assert {"q_norm", "k_norm"} <= has["qwen3"] and "q_norm" not in has["llama-gqa"]
    assert "scores_softcapped" in has["gemma2"] and "scores_softcapped" not in has["llama-gqa"]
    order = walk("qwen3", 0).names
    assert order.index("q_norm") < order.index("q_rope") < order.index("k_repeated") < order.index("probs")


def test_masks_causal_sliding_and_encoder():
    N = len(walk("llama-gqa", 0).tokens)
    assert np.array_equal(walk("llama-gqa", 0).mask, np.tril(np.ones((N, N), bool)))
    # Gemma 2 alternates: layer 0 slides over 4 positions, layer 1 sees all the past
    g0, g1 = walk("gemma2", 0), walk("gemma2", 1)
    assert g0.sliding_window == 4 and g1.sliding_window is None
    assert g0.mask[N - 1].sum() == 4 and g1.mask[N - 1].sum() == N
    assert walk("mistral-sliding", 2).sliding_window == 4
    assert walk("bert", 0).mask.all() and not walk("bert", 0).causal
    assert allowed_mask(5, True, 2).sum(-1).tolist() == [1, 2, 2, 2, 2]


def test_gemma2_scale_and_softcap_come_from_the_config():
    wt = walk("gemma2", 0)
    assert wt.scaling == pytest.approx(16**-0.5) and wt.softcap == 5.0
    capped = wt.step("scores_softcapped").value
    assert np.abs(capped).max() < 5.0


def test_gpt2_uses_its_fused_conv1d_and_biases():
    lm = loaded("gpt2")
    wt = walk("gpt2", 1)
    attn = lm.model.transformer.h[1].attn
    x = torch.from_numpy(wt.x.copy())
    qkv = attn.c_attn(x[None])[0].detach().numpy()  # (N, 3C): x @ W + b, W stored (in, out)
    C = lm.layout.d_model
    assert np.abs(wt.step("q_proj").value[0] - qkv[:, :C]).max() < TOL
    assert np.abs(wt.step("v_proj").value[0] - qkv[:, 2 * C :]).max() < TOL
    assert "c_attn" in wt.step("q_proj").description and "+ b_q" in wt.step("q_proj").description


def test_bert_compares_the_output_dense_before_residual_and_layernorm():
    wt = walk("bert", 0)
    assert "output.dense" in wt.compared_output and "LayerNorm" in wt.compared_output
    assert wt.counterfactuals.no_mask is None and wt.counterfactuals.no_rope is None


@pytest.mark.parametrize("arch", ARCHS)
def test_counterfactuals(arch):
    lm = loaded(arch)
    lay = lm.layout
    sharper = 0
    for layer in range(lay.n_layers):
        wt = walk(arch, layer)
        cf = wt.counterfactuals
        N = len(wt.tokens)
        patterns = [p for p in (cf.no_rope, cf.no_mask, cf.no_scaling, cf.ungrouped) if p is not None]
        for p in patterns:
            assert p.dtype == np.float32 and p.shape == (lay.n_heads, N, N)
            assert np.allclose(p.sum(-1), 1.0, atol=1e-5)
        if lay.kind == "decoder":
            upper = ~np.tril(np.ones((N, N), bool))
            assert (cf.no_mask[:, upper] > 0).all()
            assert (cf.no_scaling[:, upper] == 0).all() and (
                cf.no_rope is None or (cf.no_rope[:, upper] == 0).all()
            )
        sharper += entropy(cf.no_scaling) < entropy(wt.probs)
        if arch in ("gpt2", "bert"):
            assert cf.no_rope is None
        else:
            assert np.abs(cf.no_rope - wt.probs).max() > 1e-3
        if lay.group_size == 1:
            assert cf.ungrouped is None and cf.ungrouped_kv_heads is None
        else:
            assert cf.ungrouped_kv_heads == tuple(h % lay.n_kv_heads for h in range(lay.n_heads))
            for h, g in enumerate(cf.ungrouped_kv_heads):
                same = np.abs(cf.ungrouped[h] - wt.probs[h]).max() < 1e-6
                assert same == (g == lay.kv_head_of(h)), (layer, h)
    assert sharper == lay.n_layers  # without 1/sqrt(d) every layer's rows are peakier


def test_counterfactuals_can_be_skipped():
    wt = layer_walkthrough(loaded("llama-gqa"), TEXT, 0, counterfactuals=False)
    assert wt.counterfactuals is None and wt.max_abs_diff_probs <= TOL


def test_chat_template_tokens():
    lm = loaded("llama-gqa")
    wt = layer_walkthrough(lm, TEXT, 1, chat=True)
    assert len(wt.tokens) == len(attnviz.tokenize(lm, TEXT, chat=True)[0]) > len(walk("llama-gqa", 1).tokens)
    assert any(wt.tokens.template) and wt.max_abs_diff_probs <= TOL


def test_hooks_are_removed_and_the_fast_path_still_works():
    lm = loaded("qwen3")

    def hooks() -> int:
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in lm.model.modules())

    before = hooks()
    layer_walkthrough(lm, TEXT, 2)
    assert hooks() == before
    res = attnviz.extract(lm, TEXT, path="fast")
    assert np.abs(res.layer(2) - walk("qwen3", 2).probs).max() <= TOL


@pytest.mark.parametrize("arch", ["bart", "t5"])
def test_unsupported_architectures_name_the_supported_ones(arch):
    with pytest.raises(attnviz.AttnvizError, match=r"supports llama.*bert"):
        layer_walkthrough(tiny.loaded(arch), TEXT, 0)
    assert "bart" not in SUPPORTED


def test_bad_layer_and_long_text():
    lm = loaded("gpt2")
    with pytest.raises(attnviz.BadIndex, match=r"layers 0\.\.2"):
        layer_walkthrough(lm, TEXT, 3)
    with pytest.raises(attnviz.InputTooLong, match="up to 4 tokens"):
        layer_walkthrough(lm, TEXT, 0, max_tokens=4)
    with pytest.raises(attnviz.EmptyInput):
        layer_walkthrough(lm, "  ", 0)


LLAMA_3B = attnviz.AttentionLayout(
    model_type="llama", kind="decoder", n_layers=28, n_heads=24, n_kv_heads=8, head_dim=128, d_model=3072
)


def test_shape_table_llama_3_2_3b():
    rows = shape_table(LLAMA_3B, 9)
    table = {step: shape for step, _, shape in rows}
    assert rows[0] == ("Input x", "hidden states entering attention", (1, 9, 3072))
    assert table["Q = x W_q"] == (1, 9, 3072)
    assert table["K = x W_k"] == (1, 9, 1024)
    assert table["Q view"] == (1, 9, 24, 128)
    assert table["Q transpose"] == (1, 24, 9, 128)
    assert table["K transpose"] == (1, 8, 9, 128)
    assert table["K repeat"] == (1, 24, 9, 128) and "3x" in dict((s, o) for s, o, _ in rows)["K repeat"]
    assert table["scores"] == (1, 24, 9, 9)
    assert table["attention"] == (1, 24, 9, 128)
    assert table["transpose back"] == (1, 9, 24, 128)
    assert table["concat"] == (1, 9, 3072)
    assert rows[-1][0] == "output" and rows[-1][2] == (1, 9, 3072)
    steps = [s for s, _, _ in rows]
    assert steps.index("Q view") < steps.index("Q transpose") < steps.index("scores") < steps.index("concat")


def test_shape_table_without_gqa_has_no_repeat():
    rows = shape_table(tiny.loaded("gpt2").layout, 5)
    assert not any("repeat" in s for s, _, _ in rows)


@pytest.mark.parametrize("arch", ["llama-gqa", "bert"])
def test_shape_table_agrees_with_the_walkthrough(arch):
    wt = walk(arch, 0)
    table = {step: shape for step, _, shape in shape_table(wt.layout, len(wt.tokens))}
    pairs = {
        "Input x": "x",
        "Q = x W_q": "q_proj",
        "K = x W_k": "k_proj",
        "Q view": "q_view",
        "Q transpose": "q_heads",
        "K transpose": "k_heads",
        "scores": "scores_raw",
        "attention weights": "probs",
        "attention": "context_heads",
        "transpose back": "context_transposed",
        "concat": "concat",
        "output": "output",
    }
    if wt.layout.group_size > 1:
        pairs["K repeat"] = "k_repeated"
    for row, step in pairs.items():
        assert table[row] == wt.step(step).shape, row


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["smollm2-135m", "minilm-l6"])
def test_builtin_models(spec):
    lm = attnviz.load_model(spec)
    n = lm.layout.n_layers
    for layer in sorted({0, n // 2, n - 1}):
        wt = layer_walkthrough(lm, TEXT, layer)
        assert wt.max_abs_diff_probs <= TOL, layer
        assert wt.max_abs_diff_output <= TOL, layer
        assert wt.max_abs_diff_context <= TOL, layer
        assert entropy(wt.counterfactuals.no_scaling) < entropy(wt.probs)
    if spec == "smollm2-135m":
        assert (lm.layout.n_heads, lm.layout.n_kv_heads, n) == (9, 3, 30)
        assert wt.step("k_repeated").shape[1] == 9 and wt.counterfactuals.ungrouped is not None
    else:
        assert wt.counterfactuals.ungrouped is None and not wt.causal
