"""The fast exact path of eager-only families (attnviz/adapters): GPT-J, CodeGen, GPT-Neo, Falcon
(rotary multi-query, multi-head, new decoder architecture, ALiBi), BLOOM, MPT (with clip_qkv),
XGLM, TrOCR, FSMT, MVP, MPNet, GPT-NeoX-Japanese, OpenAI GPT, XLM, FlauBERT, RoFormer, and BERT's
self-attention as MegatronBERT, RemBERT and TAPAS copy it.

Every test builds a tiny random model from the family's own config class and compares with a
SEPARATE eager load of the same weights (``output_attentions=True``): fp32, every layer, within
1e-4, on an input longer than the tiny configs' sizes (300 tokens), with query blocks small
enough that the ALiBi path splits the rows. Measured max |Δ| at 300 tokens: 6e-8 or less, ALiBi
families 1.5e-6 (MPT), 7.3e-7 (Falcon-ALiBi), 4.5e-7 (BLOOM); at 4096 tokens (a one-off run)
BLOOM 6.3e-6, MPT 9.5e-6, Falcon-ALiBi 2.1e-5, GPT-J 6e-8: ALiBi scores grow to slope x N and
eager's float32 rounding at that size differs from ours (the order of the additions differs).
The fast forward is watched op by op: no attention module makes a (heads, N, N) tensor. A wrong
adapter (ALiBi dropped, scale off, mask ignored) must be caught by the load probe and send the
model to the exact layer-at-a-time path.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from adapter_models import ROWS, VARIANTS, N, build, eager_reference, ids, wrap
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import attnviz
from attnviz.capture import adapters
from attnviz.capture.adapters import families


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(adapters, "QUERY_ROWS", ROWS)


@pytest.mark.parametrize("variant", [v for v, (_, kind, _) in VARIANTS.items() if kind != "seq2seq"])
def test_fast_exact_matches_a_separate_eager_load(variant):
    model, eager = build(variant)
    lm = wrap(model)
    assert lm.adapted and lm.fast_exact, lm.probe and lm.probe.why_not_fast
    res = attnviz.extract_ids(lm, ids(), verify=True)
    assert res.method == "fast exact" and res.path == "fast"
    assert res.check is not None and res.check.max_abs_diff <= 1e-5  # the self-check ran and passed
    ref = eager_reference(eager, ids())
    assert len(ref) == res.n_layers() == lm.layout.n_layers
    for layer, theirs in enumerate(ref):
        ours = res.layer_tensor(layer)
        assert ours.shape == theirs.shape == (lm.layout.n_heads, N, N)
        assert float((ours - theirs).abs().max()) <= 1e-4, (variant, layer)
    # Rows of any query block (the on-demand path slices rows and the ALiBi bias with them).
    rows = slice(200, 260)
    for layer, theirs in enumerate(ref):
        part = res.layer_tensor(layer, rows=rows) if _takes_rows(res) else res.layer_tensor(layer)[:, rows]
        assert float((part - theirs[:, rows]).abs().max()) <= 1e-4


@pytest.mark.parametrize("variant", ["fsmt", "mvp", "mvp-prompt"])
def test_encoder_decoder_and_cross_attention(variant):
    """FSMT runs one attention class for all three stacks (the decoder with a cache it always
    passes, the causal mask as -inf, padding as a key mask), MVP BART's: every layer of every
    stack. MVP's learned prompts add keys the token axes do not have: the exact layer-at-a-time
    path, still eager's numbers."""
    model, eager = build(variant)
    lm = wrap(model)
    res = attnviz.extract_ids(lm, ids(), verify=True)
    if variant == "mvp-prompt":
        assert not lm.fast_exact and res.method == "eager exact (one layer at a time)"
    else:
        assert res.method == "fast exact" and res.check.max_abs_diff <= 1e-5
    dec = list(res.decoder_tokens.ids)
    with torch.inference_mode():
        out = eager(
            input_ids=torch.tensor([ids()]),
            decoder_input_ids=torch.tensor([dec]),
            output_attentions=True,
            use_cache=False,
        )
    stacks = {
        "encoder": out.encoder_attentions,
        "decoder": out.decoder_attentions,
        "cross": out.cross_attentions,
    }
    for stack, tensors in stacks.items():
        assert len(tensors) == res.n_layers(stack) == 2
        for layer, theirs in enumerate(tensors):
            ours = res.layer_tensor(layer, stack=stack)
            assert float((ours - theirs[0]).abs().max()) <= 1e-4, (stack, layer)


def _takes_rows(res) -> bool:
    import inspect

    return "rows" in inspect.signature(res.layer_tensor).parameters


class BigTensors(TorchDispatchMode):
    """Counts tensors of at least heads x N x N elements made while inside an attention module."""

    def __init__(self, n: int, heads: int):
        super().__init__()
        self.n, self.limit, self.depth, self.hits = n, heads * n * n, 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.depth:
            inputs = {a.untyped_storage().data_ptr() for a in tree_flatten((args, kwargs))[0] if _dense(a)}
            for t in tree_flatten(out)[0]:
                big = _dense(t) and tuple(t.shape[-2:]) == (self.n, self.n) and t.numel() >= self.limit
                if big and t.untyped_storage().data_ptr() not in inputs:  # a view is no new tensor
                    self.hits.append(str(func))
        return out


def _dense(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() >= 2 and t.layout == torch.strided


def watch(lm: attnviz.LoadedModel, spy: BigTensors) -> list:
    def enter(*_):
        spy.depth += 1

    def leave(*_):
        spy.depth -= 1

    handles = []
    for name in lm.probe.by_call:
        module = lm.model.get_submodule(name)
        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    return handles


@pytest.mark.parametrize(
    "variant",
    ["gptj", "gpt_neo", "falcon-new-arch", "falcon-alibi", "bloom", "mpt", "mpnet", "tapas", "xlm-causal"],
)
def test_fast_forward_makes_no_heads_by_n_by_n_tensor(variant):
    """Inside the attention modules the fast forward makes nothing of heads x N x N (SDPA's
    kernels; ALiBi in blocks of query rows); the eager path makes several per layer, so the spy
    sees them when they exist."""
    model, _ = build(variant)
    lm = wrap(model)
    spy = BigTensors(N, lm.layout.n_heads)
    handles = watch(lm, spy)
    try:
        with spy:
            fast = attnviz.extract_ids(lm, ids())
        assert fast.method == "fast exact" and spy.hits == []
        with spy:
            attnviz.extract_ids(lm, ids(), path="eager")
        assert len(spy.hits) >= lm.layout.n_layers
    finally:
        for h in handles:
            h.remove()


def _wrong(adapter: families.Adapter, fn) -> families.Adapter:
    return dataclasses.replace(adapter, fn=fn)


# Each planted bug changes only the fast path (a recorder is active); eager stays the model's own.
def _bloom_without_alibi(self, hidden_states, residual, alibi, attention_mask, **kwargs):
    if adapters.recorder(self) is not None:
        alibi = torch.zeros_like(alibi)
    return families._bloom_forward(self, hidden_states, residual, alibi, attention_mask, **kwargs)


def _gptj_scale_off(self, query, key, value, attention_mask=None):
    if adapters.recorder(self) is not None:
        query = query * 1.05  # the scale 5% off
    return families._gptj_attn(self, query, key, value, attention_mask)


def _mpt_mask_ignored(self, hidden_states, position_bias, past_key_values=None, attention_mask=None, **kw):
    if adapters.recorder(self) is not None:
        attention_mask = None
    return families._mpt_forward(self, hidden_states, position_bias, past_key_values, attention_mask, **kw)


@pytest.mark.parametrize(
    ("variant", "cls", "fn"),
    [
        ("bloom", "bloom.BloomAttention", _bloom_without_alibi),
        ("gptj", "gptj.GPTJAttention", _gptj_scale_off),
        ("mpt", "mpt.MptAttention", _mpt_mask_ignored),
    ],
)
def test_a_wrong_adapter_is_caught_by_the_probe(monkeypatch, variant, cls, fn):
    """Planted adapter bugs: the load probe sees the difference and the model takes the exact
    layer-at-a-time path, whose numbers are eager's own."""
    monkeypatch.setitem(families.ADAPTERS, cls, _wrong(families.ADAPTERS[cls], fn))
    model, eager = build(variant)
    lm = wrap(model)
    assert lm.adapted and not lm.fast_exact
    assert "differs from eager" in lm.probe.why_not_fast
    res = attnviz.extract_ids(lm, ids(40))
    assert res.method == "eager exact (one layer at a time)"
    for layer, theirs in enumerate(eager_reference(eager, ids(40))):
        assert float((res.layer_tensor(layer) - theirs).abs().max()) <= 1e-6


def test_outside_a_recording_the_modules_run_their_own_eager_code():
    """Generation and the eager path see the model's own attention (weights returned)."""
    model, eager = build("falcon-alibi")
    lm = wrap(model)
    with torch.inference_mode():
        a = lm.model(input_ids=torch.tensor([ids(20)]), output_attentions=True).attentions
        b = eager(input_ids=torch.tensor([ids(20)]), output_attentions=True).attentions
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("variant", ["gptj", "bloom"])
def test_generation_then_fast_exact_on_prompt_and_generated_tokens(variant):
    """Generation runs the modules' own code (with a cache); the recorded forward over prompt +
    generated tokens is the fast path and equals eager on every layer."""
    model, eager = build(variant)
    lm = wrap(model)
    res = attnviz.extract_ids(lm, ids(30), generate=4, verify=0)
    assert res.method == "fast exact" and res.n_tokens == 34 and res.check.max_abs_diff <= 1e-5
    for layer, theirs in enumerate(eager_reference(eager, list(res.tokens.ids))):
        assert float((res.layer_tensor(layer) - theirs).abs().max()) <= 1e-4


def test_self_check_of_gptj_runs_its_own_attn():
    """GPT-J's self-check is the module's own eager ``_attn`` on the captured tensors: a wrong
    captured scale there is a failed check, not a pass."""
    model, _ = build("gptj")
    lm = wrap(model)
    res = attnviz.extract_ids(lm, ids(40), verify=1)
    assert res.check.max_abs_diff <= 1e-5
    cap = res.captured(1)
    res = res.with_capture(1, dataclasses.replace(cap, scaling=cap.scaling * 1.05))
    from attnviz.verify import self_check

    with pytest.raises(attnviz.AttnvizError, match="self-check failed"):
        self_check(lm.model, res, {"self": 1})


def test_mpt_longer_than_its_alibi_fails_as_eager_does():
    """MPT's ALiBi covers max_seq_len keys; eager cannot go past it and neither does the adapter
    (no silently shorter bias)."""
    model, _ = build("mpt")
    model.config.max_seq_len = 32
    model.transformer.config.max_seq_len = 32
    lm = wrap(model)
    with pytest.raises(RuntimeError):
        attnviz.extract_ids(lm, ids(40))


# bf16 (CPU), 64 tokens, measured max |fast - eager| per layer: GPT-J, CodeGen, GPT-Neo, Falcon
# (rotary, new architecture), MPT, XGLM 1.1e-3..2.0e-3 (layer 0 <= half a bf16 ulp: eager's
# rounding of its own weights); Falcon-ALiBi 4.5e-3 and BLOOM 5.8e-3 at every layer: their eager
# rounds the scores (QKᵀ, or BLOOM's baddbmm of ALiBi + QKᵀ) to bf16 before the softmax, where
# ours stay float32 (the query and key of a biased call are kept in float32).
BF16_SAME_INPUT = 2.0**-9 + 1e-6  # layer 0: eager rounds its weights to bf16 (half an ulp)
BF16_LATER = 1e-2  # later layers (hidden states of SDPA and eager forwards drift), and eager's
ROUNDED_SCORES = {"bloom", "falcon-alibi"}  # bf16 ALiBi scores: 1.7x the worst measured (5.8e-3)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["gptj", "gpt_neo", "falcon", "falcon-alibi", "bloom", "mpt", "xglm"])
def test_bf16_against_eager(variant):
    model, _ = build(variant, torch.bfloat16)
    lm = wrap(model)
    assert lm.fast_exact
    fast, eager = attnviz.extract_ids(lm, ids(64)), attnviz.extract_ids(lm, ids(64), path="eager")
    for layer in range(fast.n_layers()):
        d = float((fast.layer_tensor(layer) - eager.layer_tensor(layer)).abs().max())
        same_input = layer == 0 and variant not in ROUNDED_SCORES
        assert d <= (BF16_SAME_INPUT if same_input else BF16_LATER), (variant, layer, d)
        rows = fast.layer_tensor(layer).sum(-1)
        assert float((rows - 1).abs().max()) <= 1e-5  # fp32 softmax, not bf16 weights
