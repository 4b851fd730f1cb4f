"""CLI and loading: outputs, one-line errors, offline behaviour, device/dtype choice (CLI in-process)."""

import re

import numpy as np
import pytest
import tiny
import torch
from cli_run import run_cli

import attnviz
from attnviz import loading


def test_extract_npz_from_local_folder(tiny_folder, tmp_path):
    out = tmp_path / "a.npz"
    r = run_cli("extract", "--model", str(tiny_folder), "--text", "river bank", "--out", str(out))
    assert r.returncode == 0, r.stderr
    data = np.load(out)
    n = len(data["tokens"])
    assert data["attentions"].shape == (3, 4, n, n) and data["attentions"].dtype == np.float32
    assert data["input_ids"].dtype == np.int64 and data["input_ids"].shape == (n,)
    np.testing.assert_allclose(data["attentions"].sum(-1), 1, atol=1e-5)
    eager_out = tmp_path / "b.npz"
    r = run_cli(
        "extract",
        "--model",
        str(tiny_folder),
        "--text",
        "river bank",
        "--out",
        str(eager_out),
        "--path",
        "eager",
    )
    assert r.returncode == 0, r.stderr
    assert np.abs(np.load(eager_out)["attentions"] - data["attentions"]).max() <= 1e-5


def test_extract_compact_file_reads_back_as_the_live_heads(tiny_folder, tmp_path):
    """`--format compact` stores the captured queries, keys and values; `attnviz.load_npz` computes
    every head from them, equal bit for bit to the live result of the same model and text."""
    out = tmp_path / "long.npz"
    r = run_cli(
        "extract",
        "--model",
        str(tiny_folder),
        "--text",
        "river bank",
        "--out",
        str(out),
        "--format",
        "compact",
    )
    assert r.returncode == 0, r.stderr
    assert "compact: queries, keys and values; read it with attnviz.load_npz" in r.stdout
    back = attnviz.load_npz(out)
    live = attnviz.extract(attnviz.load_model(str(tiny_folder)), "river bank")
    assert "attentions" not in np.load(out).files
    for layer in range(live.n_layers()):
        for head in range(live.n_heads):
            assert np.array_equal(back.head(layer, head), live.head(layer, head)), (layer, head)


def test_extract_honours_the_token_cap_from_the_environment(tiny_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_MAX_TOKENS", "2")  # "river bank" is 3 tokens here
    r = run_cli(
        "extract", "--model", str(tiny_folder), "--text", "river bank", "--out", str(tmp_path / "x.npz")
    )
    assert r.returncode == 1 and "the limit is 2" in r.stderr, r.stderr


def test_extract_encoder_decoder_npz(tmp_path):
    folder = tmp_path / "bart"
    tiny.model("bart").save_pretrained(folder)
    tiny.tokenizer("seq2seq").save_pretrained(folder)
    out = tmp_path / "bart.npz"
    r = run_cli("extract", "--model", str(folder), "--text", "river bank", "--out", str(out))
    assert r.returncode == 0, r.stderr
    data = np.load(out)
    assert {"encoder_attentions", "decoder_attentions", "cross_attentions"} <= set(data.files)
    assert data["cross_attentions"].shape[-1] == len(data["tokens"])


def test_info_prints_layout(tiny_folder):
    r = run_cli("info", "--model", str(tiny_folder))
    assert r.returncode == 0, r.stderr
    lines = [line.strip() for line in r.stdout.splitlines() if line.strip()]
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in lines)
    assert rows["query heads"] == "4"
    assert rows["kv heads"] == "2 (GQA, 2 query heads each)"
    assert rows["layers"] == "3" and rows["head_dim"] == "16" and rows["d_model"] == "64"
    assert rows["type"] == "llama (decoder)"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["extract", "--model", "x"], "required"),
        (["info"], "required"),
        (["nonsense"], "invalid choice"),
        (["extract", "--model", "x", "--text", "t", "--out", "o.npz", "--path", "slow"], "invalid choice"),
        (["info", "--model", "/no/such/folder"], "does not exist (or is not a folder)"),
        (["info", "--model", "bad id!!"], "not a built-in model"),
    ],
)
def test_bad_arguments_one_line_no_traceback(args, message):
    r = run_cli(*args)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("attnviz: error")]
    assert len(lines) == 1 and message in lines[0]


def test_offline_hub_id_fails_fast_with_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(attnviz.ModelNeedsNetwork, match="pick a built-in model"):
        attnviz.load_model("some-org/not-cached-model")


def test_spec_classification():
    assert loading.classify_spec("smollm2-135m") == "builtin"
    assert loading.classify_spec("meta-llama/Llama-3.2-3B-Instruct") == "hub"
    assert loading.classify_spec("gpt2") == "hub"
    for local in ["/etc", "../..", "~", "./model", "file:///etc"]:
        assert loading.classify_spec(local) == "local"
    with pytest.raises(attnviz.ModelNotFound):
        loading.classify_spec("a b c")
    with pytest.raises(attnviz.NotAllowed):
        attnviz.load_model("/etc", allow_local=False)


def test_device_and_dtype_resolution():
    dev = loading.resolve_device("auto")
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    assert dev.type == ("cuda" if torch.cuda.is_available() else "mps" if mps else "cpu")
    assert torch.ones(2, device=dev).sum().item() == 2.0  # a real device: meta has no values
    assert loading.resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert loading.resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(attnviz.AttnvizError, match="unknown dtype"):
        loading.resolve_dtype("int3", torch.device("cpu"))


def test_no_attention_model_is_refused():
    from transformers import MambaConfig, xLSTMConfig

    with pytest.raises(attnviz.ModelHasNoAttention, match="no softmax attention"):
        loading.attention_layout(xLSTMConfig(hidden_size=16, num_blocks=1, vocab_size=32))
    # a Mamba has no attention either, but attnviz shows its mixers (issue 30)
    assert (
        loading.attention_layout(MambaConfig(hidden_size=16, num_hidden_layers=1, vocab_size=32)).n_layers
        == 0
    )


def test_the_offline_message_names_hf_hub_offline_only_where_it_is_set(monkeypatch):
    from attnviz.loading import load

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(attnviz.ModelNeedsNetwork, match=r"runs offline \(HF_HUB_OFFLINE=1\): unset it"):
        attnviz.load_model("some-org/not-cached-model")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(load, "hub_reachable", lambda timeout=2.0: False)  # a closed network
    with pytest.raises(attnviz.ModelNeedsNetwork) as err:
        attnviz.load_model("some-org/not-cached-model")
    assert "HF_HUB_OFFLINE" not in str(err.value)  # caught: "unset HF_HUB_OFFLINE", never set
    assert "connect this server to the internet" in str(err.value)
