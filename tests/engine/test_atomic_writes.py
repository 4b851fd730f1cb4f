"""Where every atomic write puts its temporary file, without a tmpfs: beside the target (the same
folder, so the rename is atomic and a full target disk fails the write, not the rename), written
whole and fsynced before it is renamed over the target, and gone afterwards.

A temporary file in another folder of the same disk (``/tmp`` on most machines) still renames
fine, so only a spy on the rename tells; the tmpfs tests in test_faults_writes.py skip where
nothing can be mounted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import tiny

import attnviz
from attnviz.atlas import cache as C
from attnviz.atlas.ranking import STATISTICS
from attnviz.loading import files


@pytest.fixture
def renames(monkeypatch):
    """Every os.replace: (source, target, source's bytes, files fsynced before it)."""
    seen: list[tuple[Path, Path, bytes, set[str]]] = []
    synced: set[str] = set()
    real_replace, real_fsync = os.replace, os.fsync

    def fsync(fd):
        synced.add(os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else str(fd))
        return real_fsync(fd)

    def replace(src, dst, *a, **kw):
        seen.append((Path(src), Path(dst), Path(src).read_bytes(), set(synced)))
        return real_replace(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def check(seen, target: Path) -> None:
    assert seen, "no rename: not an atomic write"
    src, dst, data, synced = seen[-1]
    assert dst == target
    assert src.parent == target.parent, f"temporary file in {src.parent}, target in {target.parent}"
    assert src.name.startswith(f".{target.name}.") and src.name.endswith(".tmp")
    assert data == target.read_bytes()  # written whole before the rename
    if os.path.exists("/proc/self/fd"):
        assert str(src) in synced  # fsynced before the rename
    assert not list(target.parent.glob("*.tmp"))


def test_atomic_write_bytes(renames, tmp_path):
    """Caught: the temporary file made in the system's temp folder (mkstemp without dir=)."""
    target = tmp_path / "a" / "out.bin"
    files.atomic_write_bytes(target, b"x" * 1000)
    check(renames, target)


def test_the_atlas_cache_entry_and_manifest(renames, tmp_path):
    store = C.AtlasCache(tmp_path / "ns")
    values = np.ones((len(STATISTICS), 2, 3))
    store.put(C.Entry("ab" * 16, ("a",), values, np.zeros((2, 3, 3))))
    check(renames, store.entry_path("ab" * 16))
    store.write_manifest({"model": "m"})
    check(renames, store.folder / "model.json")
    assert json.loads((store.folder / "model.json").read_text()) == {"model": "m"}


def test_a_folder_manifest_and_an_npz_export(renames, tmp_path):
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "w.bin").write_bytes(b"w")
    files.write_manifest(tmp_path / "f", version="1", source="s")
    check(renames, tmp_path / "f" / files.MANIFEST)
    res = attnviz.extract(tiny.loaded("llama-gqa"), "the bank")
    (tmp_path / "out").mkdir()
    attnviz.save_npz(res, tmp_path / "out" / "r.npz")
    check(renames, tmp_path / "out" / "r.npz")


def test_the_atlas_cache_fails_like_every_other_write(monkeypatch, tmp_path):
    """One atomic write, one error family: the atlas cache's full-disk error is a CannotWrite
    (worded for the atlas), and its temporary file is gone."""
    import errno

    from attnviz.errors import CannotWrite

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    store = C.AtlasCache(tmp_path / "ns")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CannotWrite, match=r"atlas cache .* is full.*this text needs"):
        store.put(
            C.Entry("ab" * 16, ("a",), np.ones((len(STATISTICS), 2, 3)), np.zeros((2, 3, 3))), remaining=3
        )
    assert not list((tmp_path / "ns").rglob("*.tmp"))
