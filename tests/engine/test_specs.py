"""attnviz.server.specs: which model names a server accepts, with specific messages, and the plugin hook
the test suite uses for its tiny models. Nothing here loads a real model."""

from __future__ import annotations

import pathlib

import pytest

import attnviz
from attnviz.loading import names
from attnviz.server import specs
from attnviz.server.settings import Settings

OPEN = Settings(demo=False, allowed_models=(), max_tokens=8192)
DEMO = Settings(demo=True, allowed_models=tuple(attnviz.BUILTIN_MODELS), max_tokens=512)


def test_a_long_id_says_how_long_and_the_limit():
    with pytest.raises(attnviz.ModelNotFound) as err:
        specs.resolve("a" * 300, OPEN)
    msg = str(err.value)
    assert "300 characters long" in msg and f"at most {names.MAX_HUB_ID}" in msg
    assert msg.count("a" * 50) == 0  # the id is not repeated back


def test_control_characters_and_bad_characters_are_named():
    with pytest.raises(attnviz.ModelNotFound, match="control characters"):
        specs.resolve("gpt2\nx", OPEN)
    with pytest.raises(attnviz.ModelNotFound, match=r"this name also has '!' '\?'"):
        specs.check_id("owner/na!me?", allow_local=False)
    with pytest.raises(attnviz.ModelNotFound, match=r"not a built-in model.*also has ' ' '!'$"):
        specs.resolve("a b!! c", OPEN)  # where local folders are served too (and none is called so)


def test_a_public_server_never_looks_at_its_disk(monkeypatch):
    """Path-like names are refused by their form alone: an existing and a missing folder get the
    same message, so an error never tells which folders exist."""
    looked = []
    monkeypatch.setattr(pathlib.Path, "exists", lambda self: looked.append(self) or True)
    public = Settings(demo=True, allowed_models=("/etc", "/nope/x", "owner/a/b"), max_tokens=512)
    messages = set()
    for spec in ("/etc", "/nope/x", "owner/a/b"):
        with pytest.raises(attnviz.NotAllowed) as err:
            specs.resolve(spec, public)
        messages.add(str(err.value))
    assert messages == {"local paths are not allowed on this server; pick a model from the list"}
    assert not looked


def test_demo_serves_its_allow_list_only():
    with pytest.raises(attnviz.NotAllowed, match="public demo only serves"):
        specs.resolve("gpt2", DEMO)
    ms = specs.resolve("minilm-l6", DEMO)
    assert ms.source == "builtin" and ms.label == "built-in, offline"


def test_sources():
    assert specs.resolve("gpt2", OPEN).source == "hub"
    assert specs.resolve("Qwen/Qwen2.5-0.5B", OPEN).label == "Hugging Face Hub"


def test_plugins_register_a_prefix_and_load_through_the_engine():
    made = []

    def load(name: str):
        made.append(name)
        return f"model {name}"

    specs.register("fake", load, "fake models")
    try:
        ms = specs.resolve("fake:abc", OPEN)
        assert (ms.source, ms.label) == ("plugin", "fake models")
        assert specs.load(ms, None, OPEN) == "model abc" and made == ["abc"]
    finally:
        specs.unregister("fake")
    with pytest.raises(attnviz.ModelNotFound):
        specs.resolve("fake:abc", OPEN)  # gone: now an ordinary (malformed) name
    with pytest.raises(ValueError, match="prefix"):
        specs.register("Bad Prefix", load, "x")


def test_tiny_models_come_only_from_the_test_suite():
    """Runtime code never imports tests/: the app's modules do not mention tiny."""
    root = pathlib.Path(__file__).resolve().parents[2]
    for path in [
        root / "app.py",
        *root.glob("ui/**/*.py"),
        *root.glob("pages/*.py"),
        *root.glob("attnviz/**/*.py"),
    ]:
        text = path.read_text()
        assert "import tiny" not in text and "tests/tiny" not in text, path


def test_a_load_classifies_its_spec_once(tmp_path, monkeypatch):
    """`resolve` classifies a spec (one filesystem look at most) and `load` loads what it said,
    without classifying it again: the one rule for a name runs once per load. Counted at both
    places that could classify: the resolver's and the loader's."""
    from atlas_helpers import save_tiny

    from attnviz.loading import load as loader

    folder = str(save_tiny(tmp_path / "tiny-gpt2"))
    seen: list[str] = []
    real = names.classify_spec

    def counting(spec: str):
        seen.append(spec)
        return real(spec)

    monkeypatch.setattr(specs, "classify_spec", counting)
    monkeypatch.setattr(loader, "classify_spec", counting)
    ms = specs.resolve(folder, OPEN)
    assert ms.source == "local"
    lm = specs.load(ms, None, OPEN)
    assert lm.spec == folder and lm.layout.n_layers > 0
    assert seen == [folder]
    seen.clear()
    attnviz.load_model(folder)  # the library's own front door classifies once too
    assert seen == [folder]
