"""Cached decode steps of the recurrent mixers (issue 39 items 3-4): a step hands its kernel one
token and the state the earlier tokens left (Mamba / FalconMamba ``mamba_selective_state_update``,
the Mamba-2 mixers' ``mamba2_selective_state_update`` (Mamba-2, Bamba, Falcon-H1, Zamba2,
Nemotron-H), the delta rule's recurrent function with ``initial_state``). Capture keeps each
step in its prefill function's layout and the store joins it to the forward it continues
(attnviz.mixers.steps): every step's row is then checked against what the step kernel returned,
and the joined rows equal the rows of one forward over the same tokens."""

from __future__ import annotations

import copy

import archs
import hybrids_tiny
import pytest
import torch
import transformers as tf

from attnviz.capture import mixers as mixer_capture
from attnviz.capture.hook import recording
from attnviz.errors import MixerNotShown
from attnviz.mixers import MixerStore

PROMPT = [3 + (i * 37) % 300 for i in range(20)]  # past the tiny models' chunk (16)
STEPS = [7, 9, 11]
MODELS = ("mamba", "falcon_mamba", "mamba2", "bamba", "falcon_h1", "zamba2", "nemotron_h", "qwen3_5_text")
KIND = {"mamba": "mamba", "falcon_mamba": "mamba", "qwen3_5_text": "gated_delta"}  # others: mamba2
STEP_FUNCTION = {"mamba": "mamba_selective_state_update", "falcon_mamba": "mamba_selective_state_update",
                 "qwen3_5_text": "torch_recurrent_gated_delta_rule"}  # fmt: skip


def _model(model_type: str, dtype: torch.dtype = torch.float32):
    if model_type == "nemotron_h":  # Mamba-2 mixers, attention and MLP blocks
        cfg = archs.tiny_config("nemotron_h")
        for k, v in {"mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 8, "n_groups": 2}.items():
            setattr(cfg, k, v)
        cfg.initializer_range = 0.2
        torch.manual_seed(0)
        model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    else:
        model = copy.deepcopy(hybrids_tiny.model(model_type))  # never the shared one: its dtype changes
    mixer_capture.install(model)
    return model.to(dtype)


def _decode(model, prompt: list[int], steps: list[int]) -> list:
    """The mixer records of a cached prefill and one cached step per token of ``steps``."""
    with recording({}) as rec, torch.inference_mode():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        cache = {k: getattr(out, k) for k in ("cache_params", "past_key_values") if getattr(out, k, None)}
        for i, token in enumerate(steps):
            n = len(prompt) + i
            at = {"cache_position": torch.tensor([n]), "position_ids": torch.tensor([[n]])}
            model(input_ids=torch.tensor([[token]]), use_cache=True, **at, **cache)
    return rec.mixers


def _forward(model, ids: list[int]) -> list:
    with recording({}) as rec, torch.inference_mode():
        model(input_ids=torch.tensor([ids]), use_cache=False)
    return rec.mixers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("model_type", MODELS)
def test_each_decode_step_is_captured_joined_and_checked(model_type, dtype):
    kind = KIND.get(model_type, "mamba2")
    model = _model(model_type, dtype)
    records = _decode(model, PROMPT, STEPS)
    steps = [r for r in records if r.inputs.get("continues")]
    step_function = STEP_FUNCTION.get(model_type, "mamba2_selective_state_update")
    assert steps and {r.function for r in steps} == {step_function}
    assert all("state" not in r.inputs and "initial_state" not in r.inputs for r in steps)  # never kept
    store = MixerStore(records, dtype)
    n = len(PROMPT) + len(STEPS)
    assert store.n_tokens == n and store.blocks(kind)
    for block in store.blocks(kind):
        check = store.check(block, kind)  # raises MixerCheckFailed
        assert f"+ {len(STEPS)} × {step_function}" in check.against and check.scale > 1e-3
        assert store.record(block, kind).output_rows[-len(STEPS) :] == tuple(range(len(PROMPT), n))
        row = store.tensor(block, kind, rows=slice(n - 1, n))
        assert row.shape[-2:] == (1, n) and torch.isfinite(row).all() and row.abs().max() > 0


# Zamba2's prefill clamps Δ >= time_step_min (dt_limit) and its decode step does not (the step
# kernel takes no dt_limit): transformers' own decode differs from its forward there (logits
# 2e-3 apart on the tiny model), so each is checked against its own kernels, not each other.
SAME_AS_FORWARD = tuple(m for m in MODELS if m != "zamba2")


@pytest.mark.parametrize("model_type", SAME_AS_FORWARD)
def test_the_joined_rows_equal_one_forward_over_the_same_tokens(model_type):
    """fp32: the prefill + steps' rows (every query row, every head) equal the rows of a forward
    without cache over prompt + steps, to 1e-5 of their scale (float32 rounding of two ways of
    computing the same conv and scan)."""
    kind = KIND.get(model_type, "mamba2")
    model = _model(model_type)
    joined = MixerStore(_decode(model, PROMPT, STEPS), torch.float32)
    whole = MixerStore(_forward(model, PROMPT + STEPS), torch.float32)
    for block in whole.blocks(kind):
        a, b = joined.tensor(block, kind), whole.tensor(block, kind)
        assert a.shape == b.shape
        assert (a - b).abs().max() <= 1e-5 * b.abs().max(), (block, float((a - b).abs().max()))
        if kind != "mamba":  # per head: the contributions through the frozen output path too
            ca, cb = joined.contributions(block, kind), whole.contributions(block, kind)
            assert (ca - cb).abs().max() <= 1e-5 * cb.abs().max()


def test_a_step_without_its_forward_is_refused_with_the_reason():
    model = _model("bamba")
    records = _decode(model, PROMPT, STEPS)
    alone = [r for r in records if r.inputs.get("continues")]
    store = MixerStore(alone, torch.float32)
    block = store.blocks("mamba2")[0]
    assert not store.checkable(block, "mamba2")
    with pytest.raises(MixerNotShown, match="continued a state from tokens no captured call saw"):
        store.tensor(block, "mamba2")


def test_a_join_that_lost_a_step_fails_its_check():
    """The check holds the join to account: drop the middle step's record and the last step's row,
    rebuilt from a history without that token, misses what the kernel computed from its state."""
    from attnviz.errors import MixerCheckFailed

    model = _model("mamba2")
    records = _decode(model, PROMPT, STEPS)
    block0 = [r for r in records if r.block == records[0].block]
    lost = [block0[0], block0[1], block0[3]]
    store = MixerStore(lost, torch.float32)
    with pytest.raises(MixerCheckFailed, match="misses the kernel's output"):
        store.check(lost[0].block, "mamba2")


TEXT = "the cat sat on the mat and then the dog"


@pytest.mark.parametrize("model_type", ["bamba", "qwen3_5_text", "falcon_h1", "kimi_linear", "zamba2"])
def test_generation_rows_come_from_the_decode_steps(model_type):
    """``extract(generate=k)`` on a hybrid: the mixers' rows come from generate's own prefill and
    decode steps (no second forward over the ids), each step's row checked against its kernel,
    and they equal a forward over the same ids to 1e-5 of scale (fp32), as do the softmax rows
    stitched from the same generation (the last step at its true position: Bamba's last row was
    0.4 off when its cache reported no tokens seen). Zamba2's decode differs from its forward
    (dt clamp, above): its rows are held to its step kernels only."""
    import attnviz

    lm = hybrids_tiny.loaded(model_type)
    res = attnviz.extract(lm, TEXT, generate=4)
    full = attnviz.extract_ids(lm, list(res.tokens.ids))
    for block, kinds in enumerate(lm.layout.mixers):
        for kind in kinds:
            if kind == "attention":
                continue
            assert "× " in res.mixer_check(block, kind).against  # the generation's steps, joined
            got, want = (torch.as_tensor(r.layer(block, mixer=kind)) for r in (res, full))
            if model_type != "zamba2":
                assert (got - want).abs().max() <= 1e-5 * want.abs().max(), (block, kind)
    if model_type == "falcon_h1":  # parallel branches: their sizes over every token, steps included
        shares = res.branch_shares(0)
        assert all(len(v) == len(res.tokens.ids) for v in shares.per_token.values())
        assert abs(sum(shares.shares.values()) - 1) < 1e-9
    for layer in range(lm.layout.n_layers):
        got, want = (torch.as_tensor(r.layer(layer)) for r in (res, full))
        if model_type != "zamba2":
            assert (got - want).abs().max() <= 1e-5, layer
