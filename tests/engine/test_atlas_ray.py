"""The atlas on Ray (a local Ray with 2 CPUs, started here): the same answer as the local engine
for 1 and 2 workers, a worker killed mid-run changes nothing, a stopped run resumes without
recomputing on either engine, and a driver killed (or Ctrl-C'd) mid-run loses nothing.

Slow: starting Ray and its workers (each imports torch and loads the model) takes seconds here."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
from atlas_helpers import same, save_tiny

from attnviz import atlas as AT
from attnviz.errors import AttnvizError

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [*AT.builtin_corpus()[:22], "word " * 300]  # the last is over 512 tokens: skipped


@pytest.fixture(scope="module")
def cluster():
    """A local Ray with 2 CPUs for the whole module (run_atlas joins it instead of starting one).
    Imported here, not at collection (the fast tier collects this module too); Ray is in the dev
    install, so a missing Ray fails these tests instead of skipping them."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("model") / "tiny-gpt2")


@pytest.fixture(scope="module")
def reference(folder, tmp_path_factory) -> AT.Atlas:
    """The local engine's answer, computed without the disk cache."""
    return AT.run_atlas(str(folder), TEXTS, use_cache=False)


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "atlas"


def workers() -> list[psutil.Process]:
    return [
        p
        for p in psutil.process_iter(["cmdline"])
        if "AtlasWorker" in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE
    ]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("n", [1, 2])
def test_ray_equals_local_for_any_worker_count(cluster, folder, reference, cache_in_tmp, n):
    seen: list[tuple[int, int]] = []
    at = AT.run_atlas(
        str(folder), TEXTS, engine="ray", workers=n, progress=lambda d, t, _: seen.append((d, t))
    )
    same(at, reference)
    assert (at.engine, at.workers, at.computed, at.reused) == ("ray", n, len(TEXTS), 0)
    assert at.skipped == ((len(TEXTS) - 1, "602 tokens, over the atlas limit of 512"),)
    assert seen == [(i, len(TEXTS)) for i in range(len(TEXTS) + 1)]
    assert len(list(cache_in_tmp.rglob("*.entry"))) == len(TEXTS)  # written as they arrived
    local = AT.run_atlas(str(folder), TEXTS)  # the local engine finds Ray's entries: same namespace
    assert (local.computed, local.reused) == (0, len(TEXTS))
    same(local, reference)


def test_a_worker_killed_mid_run_changes_nothing(cluster, folder, reference):
    killed: list[int] = []

    def kill_one(done, total, note):
        if done == 4 and not killed:
            busy = sorted(workers(), key=lambda p: ".submit" not in " ".join(p.info["cmdline"]))
            assert busy, "no Ray atlas worker process found"
            busy[0].send_signal(signal.SIGKILL)
            killed.append(busy[0].pid)

    at = AT.run_atlas(str(folder), TEXTS, engine="ray", workers=2, progress=kill_one)
    assert killed and gone(killed[0])
    same(at, reference)  # the dead worker was replaced and its text retried
    assert at.computed == len(TEXTS) and not at.cancelled  # each text delivered and saved once


def test_a_stopped_ray_run_resumes_without_recomputing(cluster, folder, reference, cache_in_tmp):
    first = AT.run_atlas(str(folder), TEXTS, engine="ray", workers=2, progress=lambda d, t, n: d < 6)
    assert first.cancelled and first.computed == 6 and len(entries(cache_in_tmp)) == 6
    saved = entries(cache_in_tmp)
    second = AT.run_atlas(str(folder), TEXTS, engine="ray", workers=2)
    assert (second.computed, second.reused) == (len(TEXTS) - 6, 6)  # none twice, none missing
    assert entries(cache_in_tmp) == {AT.text_key(t) for t in TEXTS} and saved < entries(cache_in_tmp)
    same(second, reference)


def test_a_worker_that_cannot_load_the_model_is_one_line(cluster, tmp_path):
    missing = tmp_path / "moved-away"  # a folder the driver named but the workers do not have
    with pytest.raises(AttnvizError) as err:
        AT.run_atlas(str(missing), TEXTS[:3], engine="ray", workers=1)
    assert str(err.value) == (
        f"the Ray run failed: a worker could not start: {str(missing)!r} is not a model folder "
        "(a model folder holds config.json, .safetensors weights and tokenizer files)"
    )


def ctrl_c_reaches_it() -> None:
    """In the child before Python starts: Ctrl-C's default action. A job started with `&` from a
    script (CI) inherits SIGINT ignored, and Python then keeps ignoring it (no KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(argv: list, env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "attnviz", "atlas", *map(str, argv)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=ctrl_c_reaches_it, **kw,
    )  # fmt: skip


def entries(cache: Path) -> set[str]:
    return {p.stem for p in cache.rglob("*.entry")}


def test_a_killed_or_interrupted_driver_resumes_where_it_stopped(folder, tmp_path, cache_in_tmp):
    """`attnviz atlas` killed (SIGKILL) and Ctrl-C'd (SIGINT) mid-run: the same command resumes,
    computes only what is missing (counted), and writes the same tables as one uninterrupted run."""
    texts = [f"text number {i}: " + " ".join(["the river bank"] * (1 + i % 7)) for i in range(150)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTNVIZ_CACHE": str(tmp_path / "cache")}
    argv = ["--model", folder, "--corpus", corpus, "--out", tmp_path / "atlas.csv"]
    counts = []
    for sig in (signal.SIGKILL, signal.SIGINT):
        proc = run_cli(argv, env)
        start = len(entries(cache_in_tmp))
        deadline = time.monotonic() + 240
        while len(entries(cache_in_tmp)) < start + 10:  # well into the run, far from its end
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        counts.append(len(entries(cache_in_tmp)))
        assert 0 < counts[-1] < len(texts), counts
        if sig == signal.SIGINT:
            assert proc.returncode == 130
            assert (
                f"interrupted after {counts[-1]} of 150 texts (saved in {cache_in_tmp}/" in err
                and "run the same command again to resume" in err
            )
        else:
            assert proc.returncode == -signal.SIGKILL
    proc = run_cli(argv, env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert f"150 texts ran, 0 skipped; {150 - counts[-1]} computed, {counts[-1]} from the cache;" in out
    assert entries(cache_in_tmp) == {AT.text_key(t) for t in texts}
    want = AT.run_atlas(str(folder), texts, use_cache=False)
    expected = pd.read_csv(io.StringIO(want.to_frame().to_csv(index=False)))
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "atlas.csv"), expected)


def test_the_page_sends_a_run_to_the_ray_cluster_and_shows_the_same_table(cluster, folder, monkeypatch):
    from apptest import new_app, ok, prepare

    prepare(monkeypatch)
    address = cluster.get_runtime_context().gcs_address
    monkeypatch.setenv("ATTNVIZ_RAY_ADDRESS", address)
    at = new_app("pages/5_Head_atlas.py", model=str(folder), ntexts=8).run()
    ok(at)
    at.segmented_control(key="atlas_engine").set_value("Ray cluster").run()
    ok(at)
    assert any(address in c.value for c in at.caption)
    at.button(key="atlas_run").click().run()
    ok(at)
    table = at.dataframe[0].value
    want = AT.run_atlas(str(folder), AT.builtin_corpus()[:8], use_cache=False)
    ranked = want.ranking(at.selectbox(key="stat").value)
    assert list(zip(table["layer"], table["head"], strict=True)) == [(r[0], r[1]) for r in ranked]
    np.testing.assert_allclose(table["mean"], [round(r[2], 4) for r in ranked])
