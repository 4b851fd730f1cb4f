"""`attnviz extract` / `attnviz info` on models without softmax attention (Mamba, Mamba-2, RWKV,
FalconMamba) and on hybrids: dense and compact files on both paths, never a traceback; a file of a
model without softmax layers holds its mixers' matrices and reads back as the live result."""

from __future__ import annotations

import hybrids_tiny
import numpy as np
import pytest
import tiny
from cli_run import run_cli

import attnviz

TEXT = "the river bank was steep"
PURE = ["mamba", "mamba2", "rwkv", "falcon_mamba"]
HYBRID = ["qwen3_5_text", "falcon_h1", "bamba"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {}
    for model_type in PURE + HYBRID:
        folder = tmp_path_factory.mktemp(model_type)
        hybrids_tiny.model(model_type).save_pretrained(folder)
        tiny.tokenizer().save_pretrained(folder)
        made[model_type] = folder
    return made


def _extract(folder, out, fmt, path):
    args = ["extract", "--model", str(folder), "--text", TEXT, "--out", str(out), "--format", fmt]
    return run_cli(*args, "--path", path)


@pytest.mark.parametrize("model_type", PURE)
def test_a_model_without_softmax_layers_writes_its_mixers_and_says_so(folders, tmp_path, model_type):
    folder = folders[model_type]
    live = attnviz.extract(attnviz.load_model(str(folder)), TEXT)
    blocks = [(b, kind) for b in range(live.layout.n_blocks) for kind in live.mixers(b)]
    for fmt in ("dense", "compact"):
        for path in ("fast", "eager"):
            out = tmp_path / f"{fmt}-{path}.npz"
            ran = _extract(folder, out, fmt, path)
            assert ran.returncode == 0, (fmt, path, ran.stderr)
            assert ran.stdout.count("\n") <= 2 and "has no softmax attention layer" in ran.stdout
            assert "no 'attentions' array" in ran.stdout and "0 layers x 0 heads" not in ran.stdout
            data = np.load(out)
            assert "attentions" not in data.files
            back = attnviz.load_npz(out)
            assert back.n_layers() == 0
            for b, kind in blocks:
                want = live.layer(b, mixer=kind)
                if fmt == "dense":  # numpy alone reads each block's matrix
                    np.testing.assert_array_equal(data[f"mixer_{b}_{kind}"], want)
                np.testing.assert_allclose(back.layer(b, mixer=kind), want, rtol=0, atol=1e-6)
    info = run_cli("info", "--model", str(folder))
    assert info.returncode == 0, info.stderr
    assert "no softmax attention" in info.stdout and "SDPA" not in info.stdout


@pytest.mark.parametrize("model_type", HYBRID)
def test_a_hybrid_writes_attention_and_mixers_on_both_paths(folders, tmp_path, model_type):
    folder = folders[model_type]
    for fmt, path in (("dense", "fast"), ("dense", "eager"), ("compact", "fast")):
        out = tmp_path / f"{fmt}-{path}.npz"
        ran = _extract(folder, out, fmt, path)
        assert ran.returncode == 0, (fmt, path, ran.stderr)
        back = attnviz.load_npz(out)
        assert back.n_layers() == 2 and back.layout.mixer_summary()
    ran = _extract(folder, tmp_path / "x.npz", "compact", "eager")  # one line, the fix in it
    said = [line for line in ran.stderr.splitlines() if line.startswith("attnviz:")]
    assert ran.returncode == 1 and len(said) == 1 and "use the dense format" in said[0]
    assert "Traceback" not in ran.stderr
    info = run_cli("info", "--model", str(folder))
    assert info.returncode == 0 and "token mixers" in info.stdout


@pytest.mark.parametrize("model_type", PURE)
def test_the_notebook_view_of_a_model_without_softmax_layers(model_type):
    res = attnviz.extract(hybrids_tiny.loaded(model_type), TEXT)
    n = res.n_tokens
    assert res.all_layers().shape == (0, 0, n, n)  # an empty stack, not StopIteration
    bundle = res._repr_mimebundle_()
    assert model_type.split("_")[0] in bundle["text/plain"].lower() and "text/html" in bundle
