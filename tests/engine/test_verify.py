"""The self-check, GPT-OSS sinks, Falcon's causal mask, T5Gemma soft-capping: numbers vs eager."""

from __future__ import annotations

import copy
import functools

import archs
import numpy as np
import pytest
import tiny
import torch
import transformers as tf

import attnviz
from attnviz.errors import AttnvizError

TEXT = "the financial bank is located on river bank, a quick brown fox jumps over the lazy dog"
IDS = [3 + (i * 37) % 300 for i in range(14)]


@functools.cache
def _tok():
    return tf.PreTrainedTokenizerFast(tokenizer_object=archs._tokenizer(), pad_token="<pad>")


def _pair(model_type: str, kind: str = "causal", **extra):
    """(attnviz LoadedModel, the same weights loaded separately in eager)."""
    archs.EXTRA.setdefault(model_type, {})
    saved = dict(archs.EXTRA[model_type])
    archs.EXTRA[model_type].update(extra)
    try:
        model, eager = archs.build(model_type, kind)
    finally:
        archs.EXTRA[model_type] = saved
    return attnviz.wrap_model(model, _tok(), spec=f"tiny-{model_type}"), eager


def _eager(eager, ids=IDS, **inputs) -> list[np.ndarray]:
    with torch.inference_mode():
        out = eager(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False, **inputs)
    return [a[0].float().numpy() for a in out.attentions if a is not None]


@functools.cache
def _t5gemma():
    """A tiny T5Gemma as its checkpoints have it: pad 0, BOS 1, EOS 2 (pad != BOS), sliding and full
    layers, soft-capping 5.0, fp32; and the same weights loaded separately in eager."""
    module = dict(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
        sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        attn_logit_softcapping=5.0, final_logit_softcapping=30.0,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    cfg = tf.T5GemmaConfig(encoder=dict(module), decoder=dict(module), vocab_size=512)
    torch.manual_seed(0)
    model = tf.T5GemmaForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # sharper attention than random init gives
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(3.0)
    eager = tf.T5GemmaForConditionalGeneration._from_config(copy.deepcopy(cfg), attn_implementation="eager")
    eager.load_state_dict(model.state_dict())
    return attnviz.wrap_model(model, _tok(), spec="tiny-t5gemma"), eager.eval()


def _stacks(out) -> dict[str, tuple]:
    return {
        "encoder": out.encoder_attentions,
        "decoder": out.decoder_attentions,
        "cross": out.cross_attentions,
    }


def _worst(res, out) -> dict[str, float]:
    """max |Δ| per stack between a result and an eager output (every layer)."""
    worst = {}
    for stack, ref in _stacks(out).items():
        assert len(ref) == res.n_layers(stack)
        worst[stack] = max(
            float(np.abs(res.layer(i, stack=stack) - t[0].numpy()).max()) for i, t in enumerate(ref)
        )
    return worst


def test_t5gemma_every_stack_equals_a_separate_eager_load():
    """The decoder starts from the model's own start token (its decoder's BOS, not the pad), and
    every layer of every stack equals a separate eager load given the same decoder ids - called
    with the model's defaults and without a cache (T5Gemma masks pad ids only then)."""
    lm, eager = _t5gemma()
    res = attnviz.extract_ids(lm, IDS, verify=True)
    dec = list(res.decoder_tokens.ids)
    x = torch.tensor([IDS])
    with torch.inference_mode():
        shifted = eager.prepare_decoder_input_ids_from_labels(labels=x)[0].tolist()  # its training shift
        first = int(eager.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=1)[0, 0])
    assert dec == shifted and dec[0] == first == 1 != lm.model.config.pad_token_id
    for kwargs in ({}, {"use_cache": False}):
        with torch.inference_mode():
            out = eager(input_ids=x, decoder_input_ids=torch.tensor([dec]), output_attentions=True, **kwargs)
        worst = _worst(res, out)
        assert max(worst.values()) <= 1e-5, (kwargs, worst)
    assert res.method == "fast exact"
    assert [(c.stack, c.layer) for c in res.checks] == [("encoder", 1), ("decoder", 1), ("cross", 1)]
    assert all(c.max_abs_diff <= 1e-5 and c.dtype == "float32" for c in res.checks)


def test_t5gemma_pad_ids_are_masked_as_in_the_models_own_call():
    """Pad ids in the text (encoder) and so in the decoder: attnviz gives the model the masks of
    ``tokenizer(text)`` (all ones), as generate does; eager called that way on the same ids gives
    the same numbers in every stack, and the pad keys keep their weight."""
    lm, eager = _t5gemma()
    ids = [*IDS[:4], 0, *IDS[4:8], 0, *IDS[8:]]
    res = attnviz.extract_ids(lm, ids, verify=True)
    dec = list(res.decoder_tokens.ids)
    assert dec[0] == 1 and 0 in dec
    x = torch.tensor([ids])
    with torch.inference_mode():
        out = eager(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            decoder_input_ids=torch.tensor([dec]),
            output_attentions=True,
        )
    worst = _worst(res, out)
    assert max(worst.values()) <= 1e-5, worst
    assert (res.layer(1, stack="encoder")[:, :, 4] > 0).all()  # the pad key is attended


def test_the_self_check_covers_every_stack(monkeypatch):
    """A planted bug in the decoder's self-attention only (key 0 loses its weight: the T5Gemma
    symptom) passes a check of the encoder; checking one layer of every stack catches it."""
    import attnviz.exact.sources as sources

    lm, _ = _t5gemma()
    real = sources.probs_from_capture

    def decoder_loses_key_0(cap, heads=None, rows=None):
        p = real(cap, heads, rows)
        if ".decoder." in cap.module_name and "self_attn" in cap.module_name:
            p = p.clone()
            p[..., 0] = 0
            p = torch.nan_to_num(p / p.sum(-1, keepdim=True))
        return p

    monkeypatch.setattr(sources, "probs_from_capture", decoder_loses_key_0)
    with pytest.raises(AttnvizError, match=r"self-check failed: layer 1 \(decoder\) differs"):
        attnviz.extract_ids(lm, IDS, verify=True)
    with pytest.raises(AttnvizError, match=r"self-check failed: layer 0 \(decoder\) differs"):
        attnviz.extract_ids(lm, IDS, verify=0)


def test_verify_layer_out_of_range_names_the_stack():
    lm, _ = _t5gemma()
    with pytest.raises(AttnvizError, match=r"verify layer 3 is out of range: the encoder stack has"):
        attnviz.extract_ids(lm, IDS, verify=3)


def test_load_probe_input_is_shaped_like_real_input():
    """The probe runs what extract runs: the tokenizer's special tokens around its ids, all-ones
    masks, and a decoder from the model's own start token (a pad where that is the pad: T5)."""
    from attnviz.capture.sites import decoder_start, probe_inputs

    bart = tiny.loaded("bart")
    inputs = probe_inputs(bart.model, bart.tokenizer, True)
    eos = bart.tokenizer.eos_token_id
    ids, dec = inputs["input_ids"][0].tolist(), inputs["decoder_input_ids"][0].tolist()
    assert ids[-1] == eos and dec[0] == decoder_start(bart.model) == 2 and dec[1:] == ids[:-2]
    assert inputs["attention_mask"].all() and inputs["decoder_attention_mask"].all()
    assert inputs["use_cache"] is False
    t5 = tiny.loaded("t5")
    t5_dec = probe_inputs(t5.model, t5.tokenizer, True)["decoder_input_ids"][0].tolist()
    assert t5_dec[0] == t5.model.config.pad_token_id == 0  # T5 starts its decoder from the pad
    llama = tiny.loaded("llama-gqa")
    first = probe_inputs(llama.model, llama.tokenizer, False)["input_ids"][0, 0]
    assert first == llama.tokenizer.bos_token_id
    lm, _ = _t5gemma()
    assert probe_inputs(lm.model, lm.tokenizer, True)["decoder_input_ids"][0, 0] == 1


def test_verify_records_max_diff_and_dtype():
    lm = tiny.loaded("llama-gqa")
    res = attnviz.extract(lm, TEXT, verify=True)
    assert res.check is not None and res.check.layer == lm.layout.n_layers // 2
    assert res.check.dtype == "float32" and res.check.max_abs_diff <= 1e-6
    assert res.check.caption().startswith("checked against eager: max |Δ| ")
    assert attnviz.extract(lm, TEXT, verify=0).check.layer == 0
    assert attnviz.extract(lm, TEXT).check is None
    with pytest.raises(AttnvizError, match="out of range"):
        attnviz.extract(lm, TEXT, verify=7)


def test_verify_raises_naming_the_layer_when_our_numbers_are_wrong(monkeypatch):
    """A planted bug (the causal mask dropped from our recomputation) must fail the self-check;
    a model prepared with the bug in place never takes the fast path (the load-time probe)."""
    import attnviz.exact.probabilities as result

    lm = tiny.loaded("llama-gqa")
    real = result.attention_scores

    def no_mask(*args, **kwargs):
        kwargs["is_causal"] = False
        kwargs["mask"] = None
        return real(*args, **kwargs)

    monkeypatch.setattr(result, "attention_scores", no_mask)
    with pytest.raises(AttnvizError, match=r"self-check failed: layer 1 .*differs"):
        attnviz.extract(lm, TEXT, verify=True)
    fresh = tiny.loaded("llama-gqa")
    assert not fresh.fast_exact and "differs from eager" in fresh.probe.why_not_fast
    res = attnviz.extract(fresh, TEXT, verify=True)
    assert res.method == "eager exact (one layer at a time)" and (np.triu(res.layer(1), k=1) == 0).all()


def test_gpt_oss_sinks_take_their_share_of_every_row():
    lm, eager = _pair("gpt_oss")
    with torch.no_grad():  # large sink logits: a visible share, different per head
        for name, p in lm.model.named_parameters():
            if name.endswith("sinks"):
                p.copy_(torch.linspace(-2.0, 3.0, p.numel()))
        eager.load_state_dict(lm.model.state_dict())
    res = attnviz.extract_ids(lm, IDS, verify=True)
    assert res.method == "fast exact" and res.has_sinks
    ref = _eager(eager)
    for layer in range(res.n_layers()):
        ours = res.layer(layer)
        assert np.abs(ours - ref[layer]).max() <= 1e-5
        share = res.sink_share(layer)
        np.testing.assert_allclose(share, 1.0 - ours.sum(-1), atol=1e-6)
    # Row 0 sees only key 0: its sink share is exactly sigmoid(sink - score_00).
    cap = res._captured["self"][0]
    q, k = cap.query[0, :, 0].float(), cap.key[0, :, 0].float()
    group = q.shape[0] // k.shape[0]
    s00 = (q * k.repeat_interleave(group, 0)).sum(-1) * cap.scaling
    want = torch.sigmoid(cap.sinks - s00).numpy()
    np.testing.assert_allclose(res.sink_share(0)[:, 0], want, atol=1e-6)
    assert want.max() > 0.5 and want.min() < 0.5


@pytest.mark.parametrize(
    "extra",
    [
        {"new_decoder_architecture": True, "num_kv_heads": 2},
        {"new_decoder_architecture": False, "multi_query": True, "alibi": False},
        {"new_decoder_architecture": False, "multi_query": False, "alibi": True},
    ],
    ids=["new-arch", "multi-query-rotary", "alibi"],
)
def test_falcon_keeps_its_causal_mask(extra):
    """Built with SDPA, Falcon cannot switch to eager at run time: attnviz loads it eager."""
    lm, eager = _pair("falcon", **extra)
    assert lm.model.config._attn_implementation == "eager"
    ref = _eager(eager)
    for path in ("fast", "eager"):
        res = attnviz.extract_ids(lm, IDS, path=path)
        for layer in range(res.n_layers()):
            p = res.layer(layer)
            assert (np.triu(p, k=1) == 0).all(), f"{path}: row 0 attends to later tokens"
            assert np.abs(p - ref[layer]).max() <= 1e-6
    assert res.method == "eager (all layers)"
    assert attnviz.extract_ids(lm, IDS).method == "fast exact"  # its adapter (attnviz/adapters)


def test_layer_at_a_time_keeps_inputs_not_probabilities():
    lm, _ = _pair("convbert", "masked")  # no fast adapter (GPT-J has one now)
    ids = [3 + (i * 7) % 300 for i in range(200)]
    res = attnviz.extract_ids(lm, ids)
    assert res.method == "eager exact (one layer at a time)" and not res._eager
    dense = res.n_layers() * res.n_heads * len(ids) ** 2 * 4
    assert res.nbytes < dense / 4, (res.nbytes, dense)
    p = res.layer(1)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)


def test_t5gemma_decoder_soft_capping_is_applied():
    cap = {"attn_logit_softcapping": 0.02}  # small enough to bend these tiny models' scores
    lm, eager = _pair("t5gemma", "seq2seq", encoder=cap, decoder=cap)
    res = attnviz.extract_ids(lm, IDS, verify=True)
    dec = res.decoder_tokens.ids
    with torch.inference_mode():
        out = eager(
            input_ids=torch.tensor([IDS]),
            decoder_input_ids=torch.tensor([dec]),
            output_attentions=True,
            use_cache=False,
        )
    cap = res._captured["decoder"][0]
    assert cap.softcap is not None
    raw = cap.query @ cap.key.repeat_interleave(cap.query.shape[1] // cap.key.shape[1], 1).transpose(-1, -2)
    assert cap.softcap == 0.02 and float((raw * cap.scaling).abs().max()) > 2 * cap.softcap
    for stack, ref in (("decoder", out.decoder_attentions), ("cross", out.cross_attentions)):
        for layer, t in enumerate(ref):
            assert np.abs(res.layer(layer, stack=stack) - t[0].numpy()).max() <= 1e-5


@pytest.mark.slow
def test_bf16_real_model_keeps_the_fast_path_and_passes_the_self_check():
    """30 bf16 layers: the SDPA and eager forwards drift apart with depth, which must not be
    mistaken for a capture error at load (it once sent every bf16 model to the slow path)."""
    lm = attnviz.load_model("smollm2-135m", device="cpu", dtype="bfloat16")
    assert lm.fast_exact, lm.probe.why_not_fast
    res = attnviz.extract(lm, TEXT, verify=True)
    assert res.method == "fast exact" and res.check.dtype == "bfloat16"
    assert res.check.max_abs_diff <= 2.0**-9 + 1e-6  # eager's rounding of its fp32 softmax to bf16


def test_auto_check_skips_models_without_an_eager_function(monkeypatch):
    """Custom code may have no eager function to compare with: "auto" (the app) then shows no
    check, an explicit verify says why it cannot."""
    from attnviz.exact import eager as verify

    lm = tiny.loaded("llama-gqa")
    monkeypatch.setattr(verify, "eager_function", lambda module: None)
    assert attnviz.extract(lm, TEXT, verify="auto").check is None
    with pytest.raises(verify.CannotCheck, match="no eager attention function"):
        attnviz.extract(lm, TEXT, verify=True)


def test_cli_extract_verify_prints_the_check(tmp_path, capsys):
    from attnviz import cli

    folder = tmp_path / "tiny-llama"
    tiny.model("llama-gqa").save_pretrained(folder)
    tiny.tokenizer().save_pretrained(folder)
    argv = [
        "extract",
        "--model",
        str(folder),
        "--text",
        TEXT,
        "--out",
        str(tmp_path / "a.npz"),
        "--device",
        "cpu",
    ]
    assert cli.main([*argv, "--verify"]) == 0
    out = capsys.readouterr().out
    assert "checked against eager: max |Δ| " in out and "float32 (self layer 1)" in out
    assert cli.main([*argv, "--verify", "0"]) == 0
    assert "(self layer 0)" in capsys.readouterr().out
    assert cli.main(argv) == 0
    assert "checked against eager" not in capsys.readouterr().out
