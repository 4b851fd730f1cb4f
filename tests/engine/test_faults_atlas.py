"""Fault injection, fast tier: the head atlas's per-text disk cache (attnviz/atlas/cache.py) and
the `attnviz atlas --out` tables under real faults: a zeroed entry, a full disk (a small tmpfs), a
read-only cache (a read-only bind mount). The atlas's own tests patch ``os.fsync`` for the same
errors; here the kernel answers."""

from __future__ import annotations

import re

import faults
import pandas as pd
import pytest
from atlas_helpers import same, save_tiny

from attnviz import atlas as AT
from attnviz import cli

TEXTS = [
    "the bank is by the river bank",
    "a quick brown fox jumps over the lazy dog",
    "1, 2, 3, 1, 2, 3",
    "attention is all you need",
]
mounts = pytest.mark.skipif(not faults.can_mount(), reason="cannot mount here (needs CAP_SYS_ADMIN)")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("model") / "tiny-gpt2")


@pytest.fixture(scope="module")
def reference(folder):
    """The atlas computed without any disk cache."""
    return AT.run_atlas(str(folder), TEXTS, use_cache=False)


def entries(root):
    return sorted(root.rglob("*.entry"))


def temporaries(root):
    return sorted(p.name for p in root.rglob("*.tmp"))


def test_a_zeroed_atlas_entry_is_recomputed(folder, reference, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path))
    AT.run_atlas(str(folder), TEXTS)
    zeroed = entries(tmp_path)[2]
    zeroed.write_bytes(b"\0" * zeroed.stat().st_size)  # same size, no header, no body
    again = AT.run_atlas(str(folder), TEXTS)
    assert (again.computed, again.reused) == (1, len(TEXTS) - 1) and again.cache_error == ""
    same(again, reference)
    assert AT.run_atlas(str(folder), TEXTS).computed == 0  # the recomputed entry was written back


@mounts
def test_an_atlas_cache_on_a_full_disk_is_a_message_and_the_run_goes_on(
    folder, reference, tmp_path, monkeypatch
):
    with faults.tmpfs(tmp_path / "small", 64 * 1024) as root:
        monkeypatch.setenv("ATTNVIZ_CACHE", str(root))
        faults.fill(root, 0)
        at = AT.run_atlas(str(folder), TEXTS)
        assert at.computed == len(TEXTS) and "\n" not in at.cache_error
        assert at.cache_error.startswith(f"the disk of the atlas cache '{root / 'atlas'}/"), at.cache_error
        assert (
            " is full (" in at.cache_error and ": the manifest model.json needs " in at.cache_error
        )  # the first write
        same(at, reference)
        assert temporaries(root) == []
        (root / "filler").unlink()  # space again: the next run fills the cache, the one after reads it
        assert AT.run_atlas(str(folder), TEXTS).cache_error == ""
        assert AT.run_atlas(str(folder), TEXTS).reused == len(TEXTS)


@mounts
def test_a_read_only_atlas_cache_is_a_message_and_the_run_goes_on(folder, reference, tmp_path, monkeypatch):
    root = tmp_path / "ro"
    root.mkdir()
    monkeypatch.setenv("ATTNVIZ_CACHE", str(root))
    with faults.read_only(root):
        at = AT.run_atlas(str(folder), TEXTS)
    assert "is on a read-only disk (the manifest model.json needs " in at.cache_error, at.cache_error
    assert at.computed == len(TEXTS)
    same(at, reference)


@mounts
def test_a_read_only_atlas_cache_with_entries_is_read(folder, reference, tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path))
    AT.run_atlas(str(folder), TEXTS)
    with faults.read_only(tmp_path):
        at = AT.run_atlas(str(folder), TEXTS)
    assert (at.computed, at.reused, at.cache_error) == (0, len(TEXTS), "")
    same(at, reference)


@mounts
def test_atlas_tables_on_a_full_disk_keep_the_complete_ones(folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    with faults.tmpfs(tmp_path / "out", 256 * 1024) as out_dir:
        out = out_dir / "atlas.csv"
        assert cli.main(["atlas", "--model", str(folder), "--corpus", str(corpus), "--out", str(out)]) == 0
        before = out.read_bytes()
        faults.fill(out_dir, 0)
        more = tmp_path / "more.txt"
        more.write_text("\n".join([*TEXTS, "one more text for a longer table"]) + "\n", encoding="utf-8")
        capsys.readouterr()
        code = cli.main(["atlas", "--model", str(folder), "--corpus", str(more), "--out", str(out)])
        err = capsys.readouterr().err.splitlines()
        assert code == 1
        (line,) = [x for x in err if x.startswith("attnviz: error:")]
        assert re.fullmatch(
            rf"attnviz: error: cannot write 'atlas\.csv' to {re.escape(repr(str(out_dir)))}: the disk is "
            r"full \(it needs about [\d.]+ kB, 0 bytes free there\); free some space there",
            line,
        ), line
        assert out.read_bytes() == before and temporaries(out_dir) == []
        pd.read_csv(out)  # the complete table from before still reads
