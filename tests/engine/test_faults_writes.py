"""Fault injection, fast tier: what the CLI and the engine write outside the model cache (the
`attnviz extract --out` file, the benchmark and drift sections of docs/*.md, the Hub cache) under a
full disk or a read-only folder; the app's notice for a cache it rebuilt; the robustness page's
counts and fault list kept honest."""

from __future__ import annotations

import errno
import os
import re
import time
from pathlib import Path

import faults
import numpy as np
import pytest
import transformers as tf
from cli_run import run_cli

import attnviz
from attnviz.bench import common as bench_common
from attnviz.bench import drift
from attnviz.errors import CannotWrite
from attnviz.loading import files
from attnviz.loading import load as loading_load

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "robustness.md"
mounts = pytest.mark.skipif(not faults.can_mount(), reason="cannot mount here (needs CAP_SYS_ADMIN)")
LONG = " ".join(["the bank of the river was full of water and light"] * 30)


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".*.tmp"))


def error_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.startswith("attnviz: error:")]
    assert len(lines) == 1, stderr
    return lines[0]


# -- attnviz extract --out -----------------------------------------------------------------------
@mounts
def test_extract_out_on_a_full_disk_keeps_the_complete_file(tiny_folder, tmp_path):
    with faults.tmpfs(tmp_path / "out", 2**20) as folder:
        out = folder / "a.npz"
        ran = run_cli("extract", "--model", str(tiny_folder), "--text", "river bank", "--out", str(out))
        assert ran.returncode == 0, ran.stderr
        before = out.read_bytes()
        faults.fill(folder, 8192)
        ran = run_cli("extract", "--model", str(tiny_folder), "--text", LONG, "--out", str(out))
        assert ran.returncode == 1
        line = error_line(ran.stderr)
        assert re.fullmatch(
            rf"attnviz: error: cannot write 'a\.npz' to {re.escape(repr(str(folder)))}: the disk is full "
            r"\(it needs up to [\d.]+ MB, \d+\.\d kB free there\); free some space there",
            line,
        ), line
        assert out.read_bytes() == before, "the complete file from before is kept"
        assert temporaries(folder) == []
        np.load(out)["attentions"]  # still readable


@mounts
def test_extract_out_into_a_read_only_folder_is_refused_before_loading(tiny_folder, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    with faults.read_only(folder):
        ran = run_cli("extract", "--model", str(tiny_folder), "--text", "x", "--out", str(folder / "a.npz"))
    assert ran.returncode == 2
    assert ran.stderr.strip() == (
        f"attnviz: error: argument --out: cannot write {str(folder / 'a.npz')!r}: {str(folder)!r}: "
        "Read-only file system"
    )


def test_atomic_write_keeps_the_old_file_when_a_write_raises_enospc(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"complete")

    def write(f):
        f.write(b"\1" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CannotWrite) as err:
        files.atomic_write(path, write, what="'x.bin'", needed=2000)
    assert str(err.value).startswith(
        f"cannot write 'x.bin' to {str(tmp_path)!r}: the disk is full (it needs about 2.0 kB, "
    )
    assert path.read_bytes() == b"complete" and temporaries(tmp_path) == []


def test_temporary_files_of_a_killed_writer_are_removed_by_the_next_write(tmp_path):
    """A kill -9 mid-write leaves ``.x.npz.<random>.tmp``; the next write of that file removes it
    once it is `files.STALE_SECONDS` old (a younger one may belong to a writer still running)."""
    dead, alive = tmp_path / ".x.npz.abc.tmp", tmp_path / ".x.npz.def.tmp"
    dead.write_bytes(b"\1" * 100)
    alive.write_bytes(b"\1" * 100)
    old = time.time() - files.STALE_SECONDS - 1
    os.utime(dead, (old, old))
    files.atomic_write_text(tmp_path / "x.npz", "new")
    assert temporaries(tmp_path) == [alive.name] and (tmp_path / "x.npz").read_text() == "new"


# -- docs rewritten by `attnviz bench` and `python -m attnviz.bench.drift` -----------------------------
@mounts
@pytest.mark.parametrize("writer", ["bench", "drift"])
def test_a_doc_rewrite_on_a_full_disk_keeps_the_old_doc(writer, tmp_path):
    with faults.tmpfs(tmp_path / "docs", 256 * 1024) as folder:
        doc = folder / "benchmarks.md"
        doc.write_text("# Benchmarks\n\nmeasured before\n")
        faults.fill(folder, 4096)
        body = "| row |\n" * 20_000
        with pytest.raises(CannotWrite) as err:
            if writer == "bench":
                bench_common.replace_section(doc, "extraction", body)
            else:
                drift.write_section(doc, body)
        assert str(err.value).startswith(f"cannot write 'benchmarks.md' to {str(folder)!r}: the disk is full")
        assert re.search(r"it needs about 160\.\d kB, \d+\.\d kB free there", str(err.value)), err.value
        assert doc.read_text() == "# Benchmarks\n\nmeasured before\n" and temporaries(folder) == []


# -- the Hub cache -------------------------------------------------------------------------------
@mounts
def test_a_full_hub_cache_names_its_folder(tmp_path, monkeypatch):
    """The Hub download is a stand-in (no network here); the write into the full cache is real."""
    with faults.tmpfs(tmp_path / "hub", 64 * 1024) as folder:
        faults.fill(folder, 0)

        def download(*args, **kwargs):
            with open(folder / "model.safetensors.incomplete", "wb") as f:
                f.write(b"\0" * 1_000_000)

        monkeypatch.setattr(tf.AutoConfig, "from_pretrained", download)
        monkeypatch.setattr(loading_load, "hub_reachable", lambda: True)
        monkeypatch.setattr(loading_load.hf_constants, "HF_HUB_CACHE", str(folder))
        with pytest.raises(CannotWrite) as err:
            attnviz.load_model("gpt2")
    assert re.fullmatch(
        rf"cannot write the files of 'gpt2' to {re.escape(repr(str(folder)))}: the disk is full "
        r"\(\d+ bytes free there\); free some space there or set HF_HOME elsewhere",
        str(err.value),
    ), str(err.value)


# -- docs/robustness.md --------------------------------------------------------------------------
def test_the_robustness_page_counts_its_bad_input_table():
    import robustness_cases as bad_input

    levels = [level for case in bad_input.CASES for level in case.levels]
    line = (
        f"{len(bad_input.CASES)} cases: {levels.count('engine')} at the engine, "
        f"{levels.count('app')} through the app, {levels.count('browser')} in the browser."
    )
    assert line in DOC.read_text(), f"docs/robustness.md should say: {line}"


def test_the_robustness_page_lists_every_fault_test():
    """The faults table names each test of tests/*/test_faults*.py once, and only those."""
    text = DOC.read_text()
    section = text[text.index("## Faults survived") :]
    section = section[: section.index("\n## ", 3)] if "\n## " in section[3:] else section
    listed = set(re.findall(r"`(test_[a-z0-9_]+)`", section))
    defined = {
        name
        for path in (ROOT / "tests").glob("*/test_faults*.py")
        for name in re.findall(r"^def (test_[a-z0-9_]+)\(", path.read_text(), re.M)
    }
    assert listed == defined, (sorted(defined - listed), sorted(listed - defined))


def test_nothing_is_left_mounted(tmp_path_factory):
    """The tmpfs and read-only mounts of this suite are gone afterwards (a leftover would hide a
    folder of the test run)."""
    base = str(tmp_path_factory.getbasetemp())
    mounted = Path("/proc/mounts").read_text().splitlines() if Path("/proc/mounts").exists() else []
    assert [line for line in mounted if base in line] == []
