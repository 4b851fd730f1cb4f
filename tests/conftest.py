"""What every test folder shares: the Hub offline, the tiny random models of tiny.py served as
``tiny:<arch>``, no os.exec* in the pytest process, and the inputs of the bad-input cases
(robustness_cases.py), which run at the engine (engine/) and through the app (app/).

tests/ is laid out like the code: engine/ (the attnviz package), app/ (pages in AppTest),
browser/ (a real server, Chromium), packaging/ (build, install, Docker, the example notebook);
the helpers they share live here and import by name (pyproject.toml: pythonpath = ["tests"]).
"""

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest
import tiny
import torch
import transformers as tf

tiny.register()  # `tiny:<arch>` specs for the app tests, through the engine's plugin hook


def _no_exec(*args, **kwargs):
    raise RuntimeError("a test tried to replace the pytest process (os.exec*): mock it")


# `attnviz app` execs Streamlit; a test that reached a real exec would replace pytest itself and
# end the run early with exit status 0. Make that a loud failure instead.
for _name in ("execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe"):
    setattr(os, _name, _no_exec)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Tiny model folders on disk: safetensors, pickle-only, xLSTM (no attention, nothing attnviz
    shows; kept under the key "mamba", which attnviz shows since issue 30), custom code."""
    root = tmp_path_factory.mktemp("models")
    cfg = tiny.configs()["llama-gqa"]
    model = tf.LlamaForCausalLM(cfg)
    pickle_dir = root / "pickle"
    model.config.save_pretrained(pickle_dir)
    torch.save(model.state_dict(), pickle_dir / "pytorch_model.bin")
    tiny.tokenizer().save_pretrained(pickle_dir)
    tf.xLSTMConfig(vocab_size=64, hidden_size=16, num_blocks=2, num_heads=2).save_pretrained(root / "mamba")
    for name, model_type in (("remote", "attnviz_custom"), ("remote-llama", "llama")):
        d = root / name
        if model_type == "llama":
            model.save_pretrained(d)
            tiny.tokenizer().save_pretrained(d)
        config = json.loads((d / "config.json").read_text()) if (d / "config.json").exists() else {}
        config |= {
            "model_type": model_type,
            "auto_map": {"AutoConfig": "custom.Config", "AutoModelForCausalLM": "custom.Model"},
        }
        d.mkdir(exist_ok=True)
        (d / "config.json").write_text(json.dumps(config))
        (d / "custom.py").write_text(f"import pathlib\npathlib.Path({str(d / 'RAN')!r}).write_text('ran')\n")
    return {"root": root, "pickle": pickle_dir, "mamba": root / "mamba", "remote": root / "remote",
            "remote-llama": root / "remote-llama"}  # fmt: skip


@pytest.fixture(scope="module")
def lm():
    """The tiny GQA model, one per module."""
    return tiny.loaded("llama-gqa")
