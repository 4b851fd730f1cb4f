"""Shared fixtures of the engine tests (the attnviz package, no app): the built-in real models
(slow tests only: loaded once per module that asks) and a tiny model saved as a local folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny

import attnviz


@pytest.fixture(scope="module")
def smollm() -> attnviz.LoadedModel:
    """The built-in SmolLM2-135M on the CPU in float32."""
    return attnviz.load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="module")
def minilm() -> attnviz.LoadedModel:
    """The built-in all-MiniLM-L6-v2 (a BERT encoder) on the CPU."""
    return attnviz.load_model("minilm-l6", device="cpu")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/tiny.py's Llama (GQA) and tokenizer saved as a model folder, as a user's would be."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny.model("llama-gqa").save_pretrained(folder)
    tiny.tokenizer("decoder").save_pretrained(folder)
    return folder
