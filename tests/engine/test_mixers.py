"""Non-softmax token mixers (attnviz.mixers): every family's effective attention reproduces the
kernel's own output, matches the textbook oracle, is listed per block, and is refused (never
shown wrong) when it does not check."""

from __future__ import annotations

import dataclasses
import threading

import archs
import numpy as np
import pytest
import torch
import transformers as tf

import attnviz
from attnviz.capture import mixers as mixer_capture
from attnviz.capture.hook import recording
from attnviz.errors import MixerCheckFailed, MixerNotShown
from attnviz.mixers import conv, delta, linear, reference, rglru, selective, ssd, wkv
from attnviz.mixers.store import MixerStore

# Per family: sizes that keep the models tiny and the token count past the kernel's chunk.
SHAPES: dict[str, dict] = {
    "bamba": {"mamba_d_state": 8, "mamba_chunk_size": 16},  # Mamba-2 hybrid
    "mamba2": {"n_groups": 2, "state_size": 8, "chunk_size": 16, "num_heads": 4, "head_dim": 16},
    "falcon_h1": {"mamba_d_state": 8, "mamba_chunk_size": 16},  # parallel attention + Mamba-2
    "qwen3_5_text": {  # Gated DeltaNet, 2 key heads serving 4 value heads
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
    },
    "kimi_linear": {},  # Kimi delta attention (per-key-channel decay)
    "mamba": {},  # Mamba-1, per channel
    "falcon_mamba": {},
    "jamba": {},
    "minimax": {"block_size": 8},  # lightning attention, its block loop crossed
    "lfm2_moe": {},  # gated short conv, per channel
    "qwen3_next": {"linear_num_key_heads": 2, "linear_num_value_heads": 2},
    "olmo_hybrid": {},
    "nemotron_h": {"mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 8, "n_groups": 2},
    "granitemoehybrid": {},
    "zamba2": {},
    "bailing_hybrid": {},
    "glm5_next": {},  # Kimi delta in a vision-language model (its text model, ids only)
    "rwkv": {},  # RWKV-4 WKV, per channel
    "recurrent_gemma": {},  # RG-LRU, per channel
}
N = 40  # > every chunk above (16), so the inter-chunk paths run
IDS = [3 + (i * 37) % 300 for i in range(N)]


def _model(model_type: str):
    cfg = archs.tiny_config(model_type)
    for k, v in SHAPES[model_type].items():
        setattr(cfg, k, v)
    if hasattr(cfg, "initializer_range"):
        cfg.initializer_range = 0.2  # activations O(1): an absolute error then means something
    torch.manual_seed(0)
    auto = tf.AutoModelForImageTextToText if model_type in VISION_LANGUAGE else tf.AutoModelForCausalLM
    return auto.from_config(cfg).eval()


VISION_LANGUAGE = {"glm5_next"}  # built with its image-text class; attnviz reads its text model


def _loaded(model_type: str) -> attnviz.LoadedModel:
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=archs._tokenizer(), pad_token="<pad>")
    return attnviz.wrap_model(_model(model_type), tok, spec=f"tiny-{model_type}")


def _loaded_tiny(model_type: str) -> attnviz.LoadedModel:
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=archs._tokenizer(), pad_token="<pad>")
    torch.manual_seed(0)
    return attnviz.wrap_model(tf.AutoModelForCausalLM.from_config(archs.tiny_config(model_type)).eval(), tok)


def _records(model, ids: list[int] = IDS) -> list:
    mixer_capture.install(model)
    with recording({}) as rec, torch.inference_mode():
        model(input_ids=torch.tensor([ids]), use_cache=False)
    return rec.mixers


EXPECTED_KIND = {
    "bamba": "mamba2",
    "mamba2": "mamba2",
    "falcon_h1": "mamba2",
    "qwen3_5_text": "gated_delta",
    "kimi_linear": "kimi_delta",
    "mamba": "mamba",
    "falcon_mamba": "mamba",
    "jamba": "mamba",
    "minimax": "lightning",
    "lfm2_moe": "short_conv",
    "qwen3_next": "gated_delta",
    "olmo_hybrid": "gated_delta",
    "nemotron_h": "mamba2",
    "granitemoehybrid": "mamba2",
    "zamba2": "mamba2",
    "bailing_hybrid": "kimi_delta",
    "glm5_next": "kimi_delta",
    "rwkv": "rwkv",
    "recurrent_gemma": "rglru",
}


@pytest.mark.parametrize("model_type", list(SHAPES))
def test_every_family_reproduces_its_kernel_and_says_so(model_type):
    """The self-check (Σ_s A[t,s] v_s + skip vs the kernel's captured output) passes within its
    relative tolerance, lands in res.checks, and every mixer block returns a float32 matrix."""
    lm = _loaded(model_type)
    kind = EXPECTED_KIND[model_type]
    res = attnviz.extract_ids(lm, IDS, verify=True)
    (check,) = [c for c in res.checks if c.mixer == kind]
    assert check.max_abs_diff <= 1e-5 * max(check.scale, 1e-3), check.caption()
    assert check.scale > 1e-3  # compared against a real output, not zeros
    assert kind in res.check_caption()
    blocks = [b for b, kinds in enumerate(lm.layout.mixers) if kind in kinds]
    assert blocks
    for b in blocks:
        m = res.layer(b, mixer=kind)
        assert m.dtype == np.float32 and m.shape == (res.mixer_heads(b, kind), N, N)
        assert np.isfinite(m).all() and np.abs(np.triu(m[0], 1)).max() == 0  # causal
        np.testing.assert_array_equal(res.head(b, 0, mixer=kind, rows=slice(5, 9)), m[0, 5:9])


def test_ssd_matches_the_textbook_recurrence_and_the_kernel():
    (rec, *_) = _records(_model("bamba"))
    parts = ssd.ssd_parts(rec.inputs)
    heads = list(range(parts["x"].shape[1]))
    rows = torch.arange(N)
    m = ssd.ssd_rows(parts, heads, rows)
    assert (m - reference.ssd_dense(parts)).abs().max() < 1e-12
    kept = list(rec.output_rows)  # the capture keeps the kernel's output at the check's rows
    assert kept == [0, N // 3, 2 * N // 3, N - 1] and rec.n_tokens == N
    y = ssd.ssd_outputs(parts, m, heads, rows)[kept]
    out = rec.output[0].double()
    assert (y - out).abs().max() <= 1e-5 * out.abs().max()


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "kimi_linear"])
def test_delta_rule_rows_match_the_textbook_products_and_the_kernel(model_type):
    (rec, *_) = _records(_model(model_type))
    parts = delta.delta_parts(rec.inputs)
    heads = [0, parts["q"].shape[1] - 1]
    rows = torch.arange(N)
    scan = delta.scan_rows(parts, heads, rows)
    oracle = reference.delta_dense({k: v[:, heads] for k, v in parts.items()})
    assert (scan - oracle).abs().max() < 1e-12
    for chunk in (4, 7, 64):  # chunks that split the rows every way
        assert (delta.chunked_rows(parts, heads, rows, chunk=chunk) - oracle).abs().max() < 1e-12
    few = torch.tensor([3, 17, N - 1])
    assert (delta.delta_rows(parts, heads, few) - oracle[:, few]).abs().max() < 1e-12
    o = delta.delta_outputs(parts, scan, heads)[list(rec.output_rows)]
    out = rec.output[0][:, heads].double()
    assert (o - out).abs().max() <= 1e-5 * out.abs().max()


def test_lightning_matches_the_textbook_decay_across_blocks():
    model = _model("minimax")
    (rec,) = [r for r in _records(model) if r.kind == "lightning"]
    parts = linear.lightning_parts(rec.inputs)
    heads = list(range(parts["slope"].shape[0]))
    m = linear.lightning_rows(parts, heads, torch.arange(N))
    assert (m - reference.lightning_dense(parts)).abs().max() < 1e-9 * m.abs().max()
    out = rec.output[0].double().reshape(len(rec.output_rows), len(heads), -1)
    got = linear.lightning_outputs(parts, m, heads)[list(rec.output_rows)]
    assert (got - out).abs().max() <= 1e-5 * out.abs().max()


def test_per_channel_mixers_sum_their_contributions_to_the_mixer_output():
    """Mamba-1, the short conv, RWKV-4 and RG-LRU: Σ_s c_{t,s} (+ skip, biases) == the mixer's own output."""
    cases = (
        ("mamba", selective, selective.selective_parts),
        ("lfm2_moe", conv, conv.conv_parts),
        ("rwkv", wkv, wkv.wkv_parts),
        ("recurrent_gemma", rglru, rglru.rglru_parts),
    )
    for model_type, mod, build in cases:
        rec = _records(_model(model_type))[0]
        parts = build(rec.inputs)
        for i, t in enumerate(rec.output_rows):
            got = mod.contribution_sum(parts, rec.out_weight, rec.out_bias, t)
            want = rec.out_out[0, i].double()
            assert (got - want).abs().max() <= 1e-5 * want.abs().max(), model_type
    parts = selective.selective_parts(_records(_model("mamba"))[0].inputs)
    row = selective.channel_rows(parts, N - 1)[5]
    assert (row - reference.selective_dense(parts, 5)[N - 1]).abs().max() < 1e-12


def test_a_mixer_scanning_channel_groups_separately_is_read_as_one_and_checked():
    """Zamba's Mamba-1 runs one scan per "mamba head" (its own B and C) in one module call: the
    groups are read in order, and both the scans' outputs and the mixer output check."""
    lm = _loaded_tiny("zamba")
    res = attnviz.extract_ids(lm, IDS, verify=True)
    check = res.mixer_check(0, "mamba")
    assert check.max_abs_diff <= 1e-5 * check.scale and "mixer output" in check.against
    assert res.layer(0, mixer="mamba").shape == (1, N, N)


def test_a_second_core_call_of_a_per_head_mixer_is_refused_with_the_reason():
    records = _records(_model("bamba"))
    twice = dataclasses.replace(records[0])  # the same block's scan called again
    store = MixerStore([records[0], twice, records[1]], torch.float32)
    with pytest.raises(MixerNotShown, match="2 times in one forward"):
        store.tensor(records[0].block, "mamba2")
    assert store.tensor(records[1].block, "mamba2").shape[1:] == (N, N)


def test_a_matrix_that_misses_the_kernel_is_refused_not_shown():
    """A record whose kernel output does not match its inputs (here: β off by 10%) is refused
    with the reason; the good block beside it still shows."""
    records = _records(_model("qwen3_5_text"))
    bad = records[0]
    bad.inputs = {**bad.inputs, "beta": bad.inputs["beta"] * 1.1}
    store = MixerStore(records, torch.float32)
    with pytest.raises(MixerCheckFailed, match="misses the kernel's output"):
        store.tensor(bad.block, "gated_delta")
    assert store.tensor(records[1].block, "gated_delta").shape[1:] == (N, N)


def test_capture_is_scoped_to_the_recording_thread():
    """The wrapped core function records only inside this thread's recording block."""
    model = _model("bamba")
    mixer_capture.install(model)
    ids = torch.tensor([IDS])
    seen: list[int] = []

    def other():
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)  # no recorder in this thread
        seen.append(1)

    with recording({}) as rec, torch.inference_mode():
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert seen and rec.mixers == []
        model(input_ids=ids, use_cache=False)
    assert [r.block for r in rec.mixers] == [0, 2]
    with torch.inference_mode():
        model(input_ids=ids, use_cache=False)  # outside: nothing more
    assert len(rec.mixers) == 2 and not rec.mixer_stack


def test_blocks_list_their_mixers_and_parallel_blocks_say_so():
    lm = _loaded("falcon_h1")
    assert lm.layout.mixers == (("attention", "mamba2"),) * 2
    assert "2 branches (attention + mamba2)" in lm.layout.mixer_note(0)
    res = attnviz.extract_ids(lm, IDS)
    np.testing.assert_array_equal(res.layer(1, mixer="attention"), res.layer(1))
    with pytest.raises(attnviz.errors.BadIndex, match="no gated_delta mixer"):
        res.layer(0, mixer="gated_delta")
    assert "signed, not probabilities" in res.mixer_meaning("mamba2")


def test_pure_recurrent_models_load_and_name_what_they_cannot_show():
    lm = _loaded("mamba")
    assert lm.layout.n_layers == 0 and lm.layout.mixers == (("mamba",),) * 2
    res = attnviz.extract_ids(lm, IDS)
    assert res.layer(1).shape == (1, N, N)  # no attention at all: the block's first mixer
    with pytest.raises(attnviz.errors.ModelHasNoAttention, match="no softmax attention, and its mLSTM mixer"):
        _loaded_tiny("xlstm")  # nothing it could show: refused at load, with what is missing


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "bamba"])
def test_a_pooled_view_is_the_full_matrix_pooled(model_type):
    from attnviz.mixers.pooling import mixer_pooled

    n = 150  # past the delta rule's 64-token chunks
    records = _records(_model(model_type), [3 + (i * 37) % 300 for i in range(n)])
    store = MixerStore(records, torch.float32)
    kind, block = records[0].kind, records[0].block
    full = store.tensor(block, kind, [1])[0].double()  # (N, N)
    view = mixer_pooled(store, block, kind, 1, cells=7)  # blocks of 22, the last of 18
    w = view.tokens_per_bin
    for i in range(view.mean.shape[0]):
        for j in range(view.mean.shape[1]):
            tile = full[i * w : (i + 1) * w, j * w : (j + 1) * w]
            assert abs(view.mean[i, j] - float(tile.mean())) < 1e-6
            assert abs(view.absmax[i, j] - float(tile.abs().max())) < 1e-6


def test_the_notebook_draws_a_mixer_head_signed_and_labelled():
    lm = _loaded("qwen3_5_text")
    res = attnviz.extract_ids(lm, IDS)
    fig = attnviz.head_view(res, layer=0, mixer="gated_delta", heads=[0, 3])
    title = fig.layout.title.text
    assert "block 0 · gated_delta" in title and "effective attention (signed, not probabilities)" in title
    np.testing.assert_allclose(
        np.asarray(fig.data[0].z, dtype=float), res.head(0, 0, mixer="gated_delta"), atol=1e-6
    )
    axis = fig.layout.coloraxis
    assert axis.cmid == 0 and axis.cmin == -axis.cmax and "effective attention" in axis.colorbar.title.text
    pure = attnviz.extract_ids(_loaded("mamba"), IDS)
    bundle = pure._repr_mimebundle_()
    assert "token mixers: mamba in blocks 0, 1" in bundle["text/plain"]


@pytest.mark.parametrize("fmt", ["dense", "compact"])
def test_a_saved_result_keeps_its_mixers(tmp_path, fmt):
    """Both file formats rebuild the mixers from their kernel inputs (re-checked on load); a
    dense file also holds each block's matrices for numpy alone."""
    from attnviz.export import load_npz, save_npz

    res = attnviz.extract_ids(_loaded("bamba"), IDS)
    path = tmp_path / "r.npz"
    save_npz(res, path, format=fmt)
    back = load_npz(path)
    for b in (0, 2):
        np.testing.assert_array_equal(back.layer(b, mixer="mamba2"), res.layer(b, mixer="mamba2"))
    assert back.mixer_check(2, "mamba2").max_abs_diff == res.mixer_check(2, "mamba2").max_abs_diff
    with np.load(path) as data:
        assert ("mixer_0_mamba2" in data.files) == (fmt == "dense")
        if fmt == "dense":
            np.testing.assert_array_equal(data["mixer_0_mamba2"], res.layer(0, mixer="mamba2"))


def test_a_matrix_too_big_for_free_memory_is_refused_before_it_is_computed(monkeypatch):
    import attnviz.limits

    res = attnviz.extract_ids(_loaded("bamba"), IDS)
    monkeypatch.setattr(attnviz.limits, "free_bytes", lambda device: 10_000)
    with pytest.raises(attnviz.errors.OutOfMemory, match="one head at a time"):
        res.layer(0, mixer="mamba2")
    assert res.head(0, 1, mixer="mamba2", rows=slice(0, 2)).shape == (2, N)  # a tile still fits


def test_attention_maps_of_blocks_that_mix_tokens_another_way_too_say_so():
    res = attnviz.extract_ids(_loaded("falcon_h1"), IDS)
    title = attnviz.head_view(res, layer=0).layout.title.text
    assert "2 branches (attention + mamba2)" in title
    lay = dataclasses.replace(res.layout, model_type="zaya", mixers=(("attention",),))
    assert "short convolution on q/k" in lay.mixer_note(0)
    assert lay.mixer_note(0) and not dataclasses.replace(lay, model_type="llama").mixer_note(0)


def test_the_cli_names_the_mixers_and_writes_them(tmp_path, capsys):
    from attnviz import cli
    from attnviz.export import load_npz

    folder = tmp_path / "tiny-qwen35"
    _model("qwen3_5_text").save_pretrained(folder)
    tf.PreTrainedTokenizerFast(tokenizer_object=archs._tokenizer(), pad_token="<pad>").save_pretrained(folder)
    assert cli.main(["info", "--model", str(folder)]) == 0
    assert "token mixers    gated_delta in blocks 0, 2; attention in blocks 1, 3" in capsys.readouterr().out
    out = tmp_path / "r.npz"
    text = " ".join(f"t{i}" for i in range(1, 30))
    assert cli.main(["extract", "--model", str(folder), "--text", text, "--out", str(out), "--verify"]) == 0
    printed = capsys.readouterr().out
    assert "token mixers: gated_delta in blocks 0, 2" in printed and "gated_delta block 2 checked" in printed
    assert load_npz(out).layer(0, mixer="gated_delta").shape[0] == 4


@pytest.mark.parametrize("model_type", ["bamba", "qwen3_5_text", "minimax"])
def test_per_head_contributions_are_the_vectors_that_sum_to_the_mixer_output(model_type):
    """‖c_{t,s}‖ per head equals the norm of W_out[:, head] (σ_t ⊙ A[t,s] v_s) (+ D x_t at s = t),
    and those vectors over every head and source (+ bias) are the mixer's output at t."""
    records = _records(_model(model_type))
    rec = next(r for r in records if r.scale is not None)
    store = MixerStore(records, torch.float32)
    kind, block = rec.kind, rec.block
    parts = store.parts(block, kind)
    v = (parts["x"] if kind == "mamba2" else parts["v"]).double()  # (N, H, d)
    n_heads, d = v.shape[1], v.shape[2]
    sigma = rec.scale[0].double().reshape(N, n_heads, d)
    w = rec.out_weight.double()
    a = store.tensor(block, kind).double()  # (H, N, N)
    norms = store.contributions(block, kind).double()
    for i, t in enumerate(rec.output_rows):
        total = torch.zeros(w.shape[0], dtype=torch.float64)
        for h in range(n_heads):
            coef = a[h, t].clone()
            if kind == "mamba2":
                coef[t] += parts["D"][h]
            vec = (coef[:, None] * v[:, h] * sigma[t, h]) @ w[:, h * d : (h + 1) * d].T  # (N, hidden)
            assert torch.allclose(norms[h, t], vec.norm(dim=-1), rtol=1e-4, atol=1e-7)
            total += vec.sum(0)
        if rec.out_bias is not None:
            total += rec.out_bias.double()
        want = rec.out_out[0, i].double()
        assert (total - want).abs().max() <= 1e-5 * want.abs().max()


def test_the_model_view_of_a_model_without_attention_says_what_to_draw_instead():
    res = attnviz.extract_ids(_loaded("mamba"), IDS)
    with pytest.raises(attnviz.errors.BadIndex, match="no softmax attention layers; draw its mixers"):
        attnviz.model_view(res)
    assert attnviz.head_view(res, layer=1, mixer="mamba").layout.title.text
