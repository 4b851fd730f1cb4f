"""The atlas over a corpus, on the local engine: corpus formats and stable keys, the per-text disk
cache (atomic, damage detected and recomputed, a full disk is a message), resume without
recomputing, failed texts recorded, the `attnviz atlas` command and its argument checks, and Ray
kept out of every import that did not ask for it. (The Ray engine itself: test_atlas_ray.py.)"""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tiny
from atlas_helpers import same, save_tiny

from attnviz import atlas as AT
from attnviz import cli
from attnviz.atlas import cache as C
from attnviz.atlas import command, local
from attnviz.errors import AttnvizError

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [
    "the bank is by the river bank",
    "a quick brown fox jumps over the lazy dog",
    "1, 2, 3, 1, 2, 3",
    "def f(x):\n    return x + 1",
    "Hello world! <b>bold</b> & more",
    "attention is all you need",
]


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "atlas"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("model") / "tiny-gpt2")


# --- corpus ------------------------------------------------------------------------------------


def test_corpus_formats_keys_and_unreadable_lines(tmp_path):
    txt = tmp_path / "c.txt"
    txt.write_bytes(b"\xef\xbb\xbfone text\n# a comment\n\n  two\\nlines  \r\nbad \xff byte\nthree\n")
    got = AT.read_corpus(txt)
    assert [(i.index, i.text) for i in got] == [(0, "one text"), (1, "two\nlines"), (2, None), (3, "three")]
    assert got[2].error == "line 5 is not valid UTF-8 (byte 5)"
    assert got[0].key == AT.text_key("one text") and len(got[0].key) == 32
    jl = tmp_path / "c.jsonl"
    rows = [{"text": "one text"}, "not an object", {"title": "no text"}, {"text": "three", "id": 7}]
    jl.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken\n", encoding="utf-8")
    got = AT.read_corpus(jl)
    assert [i.text for i in got] == ["one text", None, None, "three", None]
    assert [i.error for i in got][1:3] == ["line 2 has no 'text' text", "line 3 has no 'text' text"]
    assert got[4].error.startswith("line 5 is not JSON")
    assert got[0].key == AT.read_corpus(txt)[0].key  # the same text has the same key in every format
    pq = tmp_path / "c.parquet"
    pd.DataFrame({"text": ["one text", None, "three"], "n": [1, 2, 3]}).to_parquet(pq)
    got = AT.read_corpus(pq)
    assert [i.text for i in got] == ["one text", None, "three"] and got[1].error == "row 1 has no text (None)"
    pd.DataFrame({"body": ["x"]}).to_parquet(tmp_path / "other.parquet")
    with pytest.raises(AttnvizError, match="has no 'text' column"):
        AT.read_corpus(tmp_path / "other.parquet")
    with pytest.raises(AttnvizError, match=r"a corpus is a \.txt, \.jsonl, \.parquet file"):
        AT.read_corpus(tmp_path / "c.csv")
    with pytest.raises(AttnvizError, match="does not exist"):
        AT.read_corpus(tmp_path / "missing.txt")
    with pytest.raises(AttnvizError, match=r"'hello world' is not a corpus file .* give texts as a list"):
        AT.run_atlas("any-model", "hello world")  # one text given as a string: said before any load
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    with pytest.raises(AttnvizError, match="has no texts"):
        AT.read_corpus(tmp_path / "empty.txt")


# --- the disk cache -------------------------------------------------------------------------------


def entry_files(cache_root: Path) -> list[Path]:
    return sorted(cache_root.rglob("*.entry"))


def test_entries_round_trip_and_every_kind_of_damage_is_detected(tmp_path):
    values = np.random.default_rng(0).random((len(AT.STATISTICS), 3, 4))
    links = np.random.default_rng(1).random((3, 4, 3))
    good = C.Entry("ab" * 16, ("<s>", "a"), values, links, fingerprint="f", layer_labels=("0", "1", "2"))
    back = C.decode(C.encode(good), good.key)
    np.testing.assert_array_equal(back.values, values)
    np.testing.assert_array_equal(back.links, links)
    assert (back.tokens, back.layer_labels, back.ok) == (good.tokens, good.layer_labels, True)
    failed = C.decode(C.encode(C.Entry("cd" * 16, error="602 tokens, over")), "cd" * 16)
    assert not failed.ok and failed.error == "602 tokens, over" and failed.values is None
    data = C.encode(good)
    # the same bytes with one statistic changed, under the original checksum: "bits flipped on disk"
    body = io.BytesIO()
    np.savez(
        body, meta=np.load(io.BytesIO(data[len(C.MAGIC) + 65 :]))["meta"], values=values + 1, links=links
    )
    flipped = data[: len(C.MAGIC) + 65] + body.getvalue()
    store = C.AtlasCache(tmp_path / "ns")
    damages = {
        "truncated": data[: len(data) // 2],
        "flipped": flipped,
        "zeros": b"\0" * len(data),
        "garbage": b"hello",
        "empty": b"",
        "other key": C.encode(C.Entry("ef" * 16, ("x",), values, links)),
    }
    for i, (what, bad) in enumerate(damages.items()):
        store.put(good)
        path = store.entry_path(good.key)
        path.write_bytes(bad)
        assert store.get(good.key) is None, what
        assert store.damaged == i + 1 and not path.exists(), what  # counted and removed
    store.put(good)
    assert store.get(good.key) is not None and store.damaged == len(damages)
    assert not list((tmp_path / "ns").rglob("*.tmp"))


def test_a_damaged_entry_is_recomputed_never_read(folder, cache_in_tmp):
    first = AT.run_atlas(str(folder), TEXTS)
    files = entry_files(cache_in_tmp)
    assert len(files) == len(TEXTS)
    flip = files[1].read_bytes()
    raw = np.load(io.BytesIO(flip[len(C.MAGIC) + 65 :]))
    body = io.BytesIO()
    np.savez(body, meta=raw["meta"], values=raw["values"] * 0.5, links=raw["links"])
    files[1].write_bytes(flip[: len(C.MAGIC) + 65] + body.getvalue())  # plausible numbers, old checksum
    files[4].write_bytes(files[4].read_bytes()[:100])  # truncated
    again = AT.run_atlas(str(folder), TEXTS)
    assert (again.computed, again.reused) == (2, len(TEXTS) - 2)
    same(again, first)


@pytest.mark.parametrize(
    ("code", "words"),
    [(errno.ENOSPC, "is full"), (errno.EROFS, "read-only disk"), (errno.EACCES, "no permission")],
)
def test_a_full_or_read_only_disk_is_one_message_and_the_run_goes_on(
    folder, cache_in_tmp, monkeypatch, code, words
):
    real_fsync, calls = os.fsync, [0]

    def fsync(fd):
        calls[0] += 1
        if calls[0] > 4:  # the manifest and the first entry fit (file + folder each), then "full"
            raise OSError(code, os.strerror(code))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    at = AT.run_atlas(str(folder), TEXTS)
    assert at.n_texts == len(TEXTS) and at.computed == len(TEXTS)  # nothing lost from this run
    assert words in at.cache_error and str(cache_in_tmp) in at.cache_error
    assert "this text needs" in at.cache_error and f"the other {len(TEXTS) - 2} texts about" in at.cache_error
    assert "\n" not in at.cache_error and "ATTNVIZ_CACHE" in at.cache_error
    assert len(entry_files(cache_in_tmp)) == 1 and not list(cache_in_tmp.rglob("*.tmp"))
    monkeypatch.setattr(os, "fsync", real_fsync)
    same(AT.run_atlas(str(folder), TEXTS), at)


def test_other_weights_under_the_same_name_are_refused(folder, cache_in_tmp, tmp_path):
    AT.run_atlas(str(folder), TEXTS[:2])
    other = save_tiny(tmp_path / "other", "gpt2")
    import torch

    lm = AT.ModelRef(str(other)).load()
    with torch.no_grad():
        next(lm.model.parameters()).mul_(2)
    lm.spec = str(folder)  # the same name, other weights
    with pytest.raises(AttnvizError, match="holds results of other weights"):
        AT.run_atlas(lm, TEXTS[:2])
    assert AT.run_atlas(lm, TEXTS[:2], fresh=True).computed == 2  # --fresh replaces them


# --- resume, failures -----------------------------------------------------------------------------


def test_an_interrupted_run_resumes_without_recomputing(folder, cache_in_tmp, monkeypatch):
    computed: list[str] = []
    real = local.compute_entry

    def counting(lm, key, text, **kw):
        computed.append(key)
        return real(lm, key, text, **kw)

    monkeypatch.setattr(local, "compute_entry", counting)

    def ctrl_c_at(n):
        def progress(done, total, note):
            if done == n:
                raise KeyboardInterrupt

        return progress

    with pytest.raises(AT.AtlasInterrupted) as stop:
        AT.run_atlas(str(folder), TEXTS, progress=ctrl_c_at(4))
    assert (stop.value.done, stop.value.total, stop.value.folder.parent) == (4, len(TEXTS), cache_in_tmp)
    assert len(computed) == 4 and len(entry_files(cache_in_tmp)) == 4
    before = list(computed)
    resumed = AT.run_atlas(str(folder), TEXTS)
    assert (resumed.computed, resumed.reused) == (2, 4)
    assert len(computed) == 6 and not set(computed[4:]) & set(before)  # none twice, none missing
    same(resumed, AT.run_atlas(str(folder), TEXTS, use_cache=False))


def test_ctrl_c_just_after_an_entry_lands_counts_it(folder, cache_in_tmp, monkeypatch):
    """Ctrl-C between an entry's rename and its count: the message counts what is on disk (the
    race CI once hit, planted here at its worst moment: in the folder fsync after the rename)."""
    import stat

    real, fired = os.fsync, []

    def interrupted_after_the_third_rename(fd):
        real(fd)
        folder_synced = stat.S_ISDIR(os.fstat(fd).st_mode)
        if folder_synced and not fired and len(entry_files(cache_in_tmp)) == 3:
            fired.append(fd)
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted_after_the_third_rename)
    with pytest.raises(AT.AtlasInterrupted) as stop:
        AT.run_atlas(str(folder), TEXTS)
    on_disk = len(entry_files(cache_in_tmp))
    assert stop.value.done == on_disk == 3
    assert AT.run_atlas(str(folder), TEXTS).reused == 3


def test_bad_texts_are_recorded_with_the_reason_and_the_run_goes_on(folder, cache_in_tmp, monkeypatch):
    texts = ["short one", "word " * 100, "  ", "lone \ud800 surrogate", "another short one"]
    at = AT.run_atlas(str(folder), texts, max_tokens=64)
    assert at.texts == ("short one", "another short one") and at.indices == (0, 4)
    reasons = dict(at.skipped)
    assert set(reasons) == {1, 2, 3}
    assert "over the atlas limit of 64" in reasons[1] and "empty" in reasons[2]
    assert "invalid Unicode" in reasons[3]
    again = AT.run_atlas(str(folder), texts, max_tokens=64)  # failures of the text itself are final
    assert again.computed == 0 and again.skipped == at.skipped
    # a failure that may pass on a retry (an unexpected error, out of memory) is reported, not cached
    from attnviz.atlas import worker

    real, calls = worker.extract_ids, []

    def flaky(lm, ids, **kw):
        calls.append(len(ids))
        if len(calls) == 2:
            raise RuntimeError("device lost")
        return real(lm, ids, **kw)

    monkeypatch.setattr(worker, "extract_ids", flaky)
    first = AT.run_atlas(str(folder), ["short one", "third text"])
    assert first.skipped == ((1, "RuntimeError: device lost"),)
    second = AT.run_atlas(str(folder), ["short one", "third text"])
    assert second.computed == 1 and second.n_texts == 2 and not second.skipped


# --- the command line --------------------------------------------------------------------------


def run_main(capsys, *argv) -> tuple[int, str, list[str]]:
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err.splitlines()


@pytest.fixture
def no_loads(monkeypatch):
    """A load here means a bad argument got through its check."""
    from attnviz.atlas import worker

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(worker, "load_model", refuse)


def test_cli_bad_arguments_are_one_line_before_a_model_loads(capsys, tmp_path, no_loads, monkeypatch):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a text\n")
    base = ["atlas", "--model", "m", "--corpus", corpus, "--out", tmp_path / "a.csv"]
    cases = [
        (["atlas", "--model", "m", "--corpus", tmp_path / "no.txt", "--out", "a.csv"], "does not exist"),
        (["atlas", "--model", "m", "--corpus", tmp_path / "c.docx", "--out", "a.csv"], "a corpus is a .txt"),
        (
            ["atlas", "--model", "m", "--corpus", corpus, "--out", tmp_path / "a.xlsx"],
            "write a .csv or .parquet",
        ),
        (["atlas", "--model", "m", "--corpus", corpus, "--out", tmp_path], "is a folder"),
        ([*base, "--engine", "spark"], "invalid choice: 'spark'"),
        ([*base, "--workers", "0"], "'0' must be 1 or more"),
        ([*base, "--workers", "2"], "the local engine runs one worker; add --engine ray"),
        ([*base, "--ray-address", "head:6379"], "add --engine ray to use a Ray cluster"),
        ([*base, "--max-tokens", "none"], "'none' is not a whole number"),
        ([*base, "--dtype", "int3"], "unknown dtype 'int3'"),
        (["atlas", "--corpus", corpus, "--out", "a.csv"], "the following arguments are required: --model"),
    ]
    for argv, message in cases:
        code, _, lines = run_main(capsys, *argv)
        assert code == 2, (argv, lines)
        assert len(lines) == 1 and lines[0].startswith("attnviz: error: ") and message in lines[0], lines
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    code, _, lines = run_main(capsys, *base, "--engine", "ray")
    assert code == 2 and lines == [
        'attnviz: error: argument --engine: the Ray engine needs Ray: pip install "attnviz[ray]"'
    ]


def test_ray_missing_is_an_install_hint(folder, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(AttnvizError, match=r'the Ray engine needs Ray: pip install "attnviz\[ray\]"'):
        AT.run_atlas(str(folder), TEXTS, engine="ray")


def test_cli_writes_the_three_tables_and_resumes(capsys, folder, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS) + "{oops\n", encoding="utf-8")
    out = tmp_path / "out" / "atlas.parquet"
    code, stdout, err = run_main(capsys, "atlas", "--model", folder, "--corpus", corpus, "--out", out)
    assert code == 0, err
    assert f"{len(TEXTS)} texts ran, 1 skipped; {len(TEXTS)} computed, 0 from the cache;" in stdout
    assert err[-1].startswith("[########################] 6/6 texts · ") and "texts/s" in err[-1]
    want = AT.run_atlas(str(folder), TEXTS)
    heads = pd.read_parquet(out)
    pd.testing.assert_frame_equal(heads, want.to_frame())
    per_text = pd.read_parquet(tmp_path / "out" / "atlas.texts.parquet")
    assert len(per_text) == len(TEXTS) * 12
    row = per_text[(per_text["text_index"] == 3) & (per_text["layer"] == 2) & (per_text["head"] == 1)].iloc[0]
    assert row["sink"] == want.values["sink"][3, 2, 1] and row["key"] == AT.text_key(TEXTS[3])
    assert row["link_weight"] == want.links[3, 2, 1, 2]
    skipped = pd.read_parquet(tmp_path / "out" / "atlas.skipped.parquet")
    assert skipped.to_dict("records") == [
        {"text_index": 6, "reason": "line 7 is not JSON (Expecting property name enclosed in double quotes)"}
    ]
    code, stdout, _ = run_main(
        capsys, "atlas", "--model", folder, "--corpus", corpus, "--out", tmp_path / "a.csv"
    )
    assert code == 0 and f"; 0 computed, {len(TEXTS)} from the cache;" in stdout
    assert pd.read_csv(tmp_path / "a.csv")["sink_mean"].tolist() == pytest.approx(heads["sink_mean"].tolist())


def test_terminal_progress_shows_done_throughput_and_time_left(monkeypatch):
    clock = iter([100.0, 110.0, 120.0])
    monkeypatch.setattr(command.time, "perf_counter", lambda: next(clock))
    stream = io.StringIO()
    bar = command.TerminalProgress(stream, every=5, width=10)
    bar(40, 200, "")  # 40 texts from the cache: the rate counts only this run's
    bar(60, 200, "")
    bar(200, 200, "done")
    lines = stream.getvalue().splitlines()
    assert lines == [
        "[##........] 40/200 texts",
        "[###.......] 60/200 texts · 2.00 texts/s · 1m10s left",
        "[##########] 200/200 texts · 8.00 texts/s · 0s left",
    ]


@pytest.mark.slow  # a fresh interpreter that imports torch: 7-9 s
def test_ray_is_imported_only_when_its_engine_runs(folder, tmp_path):
    """The library, the command line and a local atlas run never import Ray."""
    script = (
        "import sys, attnviz, attnviz.atlas, attnviz.cli as cli\n"
        "from attnviz.atlas import command, run, ray_engine\n"
        "cli._parser()\n"
        f"at = attnviz.atlas.run_atlas({str(folder)!r}, ['a short text', 'another one'])\n"
        "assert at.n_texts == 2\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTNVIZ_CACHE": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_ray_plan_takes_one_gpu_per_actor_or_splits_the_cores():
    """How a run uses a cluster, from its resources (a stand-in for `ray`: no cluster needed)."""
    from types import SimpleNamespace

    from attnviz.atlas.ray_engine import RaySession

    def session(resources: dict) -> RaySession:
        s = object.__new__(RaySession)
        s.ray = SimpleNamespace(
            cluster_resources=lambda: resources,
            remote=lambda **kw: lambda fn: SimpleNamespace(remote=lambda: ("probe", kw)),
            get=lambda ref, timeout=None: "bfloat16" if ref == ("probe", {"num_gpus": 1}) else "?",
        )
        return s

    ref = AT.ModelRef("m")
    gpus = session({"CPU": 64.0, "GPU": 4.0}).plan(ref, None)
    assert (gpus.workers, gpus.num_gpus, gpus.num_cpus, gpus.threads) == (4, 1, 1, 0)
    assert (gpus.ref.device, gpus.ref.dtype) == ("cuda", "bfloat16")  # "auto" as a GPU worker sees it
    assert (
        session({"CPU": 64.0, "GPU": 4.0}).plan(AT.ModelRef("m", dtype="float32"), 2).ref.dtype == "float32"
    )
    on_cpu = session({"CPU": 64.0, "GPU": 4.0}).plan(AT.ModelRef("m", device="cpu"), 8)
    assert (on_cpu.ref.device, on_cpu.num_gpus, on_cpu.num_cpus, on_cpu.threads) == ("cpu", 0, 8, 8)
    two = session({"CPU": 2.0})
    assert (two.plan(ref, 2).num_cpus, two.plan(ref, 2).threads) == (1, 1)  # 2 workers x 1 thread
    assert (two.plan(ref, None).workers, two.plan(ref, None).threads, two.plan(ref, None).ref.dtype) == (
        1,
        2,
        "float32",
    )
    with pytest.raises(AttnvizError, match="the Ray cluster has 2 CPUs; give --workers 2 or fewer"):
        two.plan(ref, 3)
    with pytest.raises(AttnvizError, match="the Ray cluster has no GPU"):
        two.plan(AT.ModelRef("m", device="cuda"), 1)
    with pytest.raises(AttnvizError, match="the Ray cluster has 4 GPUs"):
        session({"CPU": 64.0, "GPU": 4.0}).plan(ref, 5)


def test_a_model_built_in_python_cannot_be_sent_to_ray():
    with pytest.raises(AttnvizError, match="exists only in this process, so Ray workers cannot load it"):
        AT.run_atlas(tiny.loaded("gpt2"), TEXTS, engine="ray")
