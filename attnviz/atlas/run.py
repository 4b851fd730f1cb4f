"""`run_atlas`: a corpus through one model on the local engine or on Ray, resumable.

    atlas = run_atlas(lm, builtin_corpus())                          # in this process
    atlas = run_atlas("smollm2-135m", "corpus.jsonl", engine="ray", workers=4)

Every text that finishes goes to the disk cache at once (`attnviz.atlas.cache`); a second call
with the same model, settings and texts reads the entries and computes only what is missing, so a
run stopped by Ctrl-C, a killed worker or a killed driver resumes where it stopped. The result is
assembled in corpus order from the entries, whichever engine and however many workers made them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

import numpy as np

from ..envflags import text
from ..errors import AttnvizError
from ..layout import Stack
from ..loading import LoadedModel, classify_spec
from .cache import AtlasCache, CacheWriteError, Entry, namespace
from .corpus import CORPUS_SUFFIXES, TextItem, items, read_corpus
from .local import run_local
from .ranking import STATISTICS, Atlas
from .worker import ModelRef, dtype_name, fingerprint

if TYPE_CHECKING:
    from .ray_engine import RaySession

log = logging.getLogger(__name__)

Engine = Literal["local", "ray"]
ENGINES: tuple[str, ...] = get_args(Engine)
ATLAS_MAX_TOKENS = 512  # per text; longer texts are skipped (listed in ``skipped``), never cut
Progress = Callable[[int, int, str], "bool | None"]


def _spec_identity(spec: str) -> dict[str, object]:
    """The spec as a cache name: a local folder by its resolved path and its files' sizes and
    modification times (cheap, and new weights in the same folder make a new name)."""
    try:
        local = classify_spec(spec) == "local"
    except AttnvizError:
        local = False
    if not local:
        return {"spec": spec.strip()}
    folder = Path(spec).expanduser().resolve()
    files = sorted(p for p in folder.glob("*") if p.is_file())
    return {"spec": str(folder), "files": [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]}


def identity(spec: str, revision: str | None, device: str, dtype: str) -> dict[str, object]:
    """What of the model decides the numbers of an atlas entry (the cache namespace hashes this,
    the stack and the token limit)."""
    return {
        **_spec_identity(spec),
        "revision": revision,
        "device": device.split(":")[0],
        "dtype": dtype,
    }


def ref_of(lm: LoadedModel, revision: str | None = None) -> ModelRef:
    """How a Ray worker loads the model ``lm`` (its spec and dtype); refuses a model that exists only
    in this process (built in Python, or a name only this server knows)."""
    try:
        loadable = classify_spec(lm.spec) != "local" or Path(lm.spec).expanduser().is_dir()
    except AttnvizError:
        loadable = False
    if not loadable or (lm.source == "local" and not Path(lm.spec).expanduser().is_dir()):
        raise AttnvizError(
            f"{lm.spec!r} exists only in this process, so Ray workers cannot load it; save it "
            "(save_pretrained) and give the folder, or use the local engine"
        )
    return ModelRef(lm.spec, device="auto", dtype=dtype_name(lm.dtype), revision=revision)


def cluster_address() -> str | None:
    """The Ray cluster the app sends atlas runs to ($ATTNVIZ_RAY_ADDRESS), or None."""
    return text("ATTNVIZ_RAY_ADDRESS") or None


def cached_count(
    lm: LoadedModel, texts: Sequence[str], *, stack: Stack | None = None, max_tokens: int = ATLAS_MAX_TOKENS
) -> tuple[int, int]:
    """(texts of ``texts`` already in the disk cache for ``lm``, distinct texts): a run computes
    only the difference."""
    ident = identity(lm.spec, None, lm.device.type, dtype_name(lm.dtype))
    cache = AtlasCache.for_namespace(
        namespace({**ident, "stack": stack or "default", "max_tokens": max_tokens})
    )
    keys = {it.key for it in items(texts)}
    return sum(cache.entry_path(k).is_file() for k in keys), len(keys)


def as_items(texts: Sequence[str] | Sequence[TextItem] | str | Path) -> list[TextItem]:
    if isinstance(texts, str | Path):
        if isinstance(texts, str) and Path(texts).suffix.lower() not in CORPUS_SUFFIXES:
            raise AttnvizError(
                f"{texts[:40]!r} is not a corpus file (.txt, .jsonl, .parquet); give texts as a list"
            )
        return read_corpus(texts)
    listed = list(texts)
    if listed and all(isinstance(t, TextItem) for t in listed):
        return listed  # type: ignore[return-value]
    return items(str(t) for t in listed)


class _Run:
    """The sink both engines report to: progress, cancel, and the write of each entry."""

    def __init__(self, cache: AtlasCache | None, total: int, done: int, progress, cancel, model: str, fresh):
        self.cache, self.total, self.before_run, self.fresh = cache, total, done, fresh
        self.progress, self.cancel, self.model = progress, cancel, model
        self.entries: dict[str, Entry] = {}
        self.computed = 0
        self.cache_error = ""
        self.stopped = False
        self.weights = ""  # the fingerprint every entry of this run must carry
        self.writing = ""  # the key being written: Ctrl-C may land after its rename, before it counts

    @property
    def done(self) -> int:
        """Texts finished: those found in the cache and those this run finished (one dict store
        counts an entry, so an interrupt never leaves it half counted)."""
        return self.before_run + len(self.entries)

    def before(self) -> bool:
        note = f"text {self.done + 1} of {self.total}"
        went_on = self.progress is None or self.progress(self.done, self.total, note) is not False
        if not went_on or (self.cancel is not None and self.cancel.is_set()):
            self.stopped = True
            return False
        return True

    def finished(self, entry: Entry) -> None:
        if entry.key in self.entries:  # a retried task delivered twice: keep the first
            return
        if entry.fingerprint and self.weights and entry.fingerprint != self.weights:
            raise AttnvizError(
                f"two workers loaded different weights for {self.model!r}; give every node the same model"
            )
        self.weights = self.weights or entry.fingerprint
        if self.cache is not None and entry.final:
            try:
                if not self.entries:
                    if not self.fresh:
                        self.cache.check_fingerprint(entry.fingerprint, self.model)
                    self.cache.write_manifest(
                        {"model": self.model, "fingerprint": entry.fingerprint, "stack": entry.stack}
                    )
                self.writing = entry.key
                self.cache.put(entry, remaining=self.total - self.done - 1)
            except CacheWriteError as err:
                self.cache_error = str(err)
                log.warning("%s; this run goes on without saving", err)
                self.cache = None  # the rest of the run stays in memory
        self.entries[entry.key] = replace(entry, encoded=b"")  # counted once saved, held without its bytes
        self.computed += 1

    def saved(self) -> int:
        """Texts finished and on disk when a run is interrupted: ``done``, plus the entry whose
        write the interrupt cut short if its rename had already happened."""
        if not self.writing or self.writing in self.entries or self.cache is None:
            return self.done
        return self.done + self.cache.entry_path(self.writing).exists()


class AtlasInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: ``done`` of ``total`` texts are finished (saved in ``folder`` when the
    run had a disk cache); the same call again resumes."""

    def __init__(self, done: int, total: int, folder: Path | None):
        super().__init__(f"interrupted after {done} of {total} texts")
        self.done, self.total, self.folder = done, total, folder


def run_atlas(
    model: LoadedModel | ModelRef | str,
    texts: Sequence[str] | Sequence[TextItem] | str | Path,
    *,
    engine: Engine = "local",
    workers: int | None = None,
    ray_address: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    revision: str | None = None,
    stack: Stack | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    use_cache: bool = True,
    fresh: bool = False,
    max_tokens: int = ATLAS_MAX_TOKENS,
    cache_root: str | Path | None = None,
) -> Atlas:
    """Run every text of ``texts`` (strings, or a .txt/.jsonl/.parquet corpus file), keep each
    head's statistics per text, and rank heads across texts.

    ``model``: a loaded model, a `ModelRef`, or a spec (loaded with ``device``/``dtype``/
    ``revision``). ``engine="ray"`` sends the texts to ``workers`` Ray actors on the cluster at
    ``ray_address`` (default: a local Ray started for this run); a loaded model is sent by its
    spec and dtype. ``progress(done, total, note)`` is called before each text and at the end;
    returning False cancels, like setting ``cancel``: the result holds what finished
    (``cancelled=True``), and what finished stays in the cache. ``use_cache=False`` neither reads
    nor writes the disk cache; ``fresh=True`` recomputes every text and overwrites its entry;
    ``cache_root`` puts the cache elsewhere than ``cache_dir()/atlas``.
    Texts that fail (over ``max_tokens`` tokens, unreadable) are listed in ``skipped``.
    """
    if engine not in ENGINES:
        raise AttnvizError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    if engine == "local" and workers not in (None, 1):
        raise AttnvizError("the local engine runs one worker; use engine='ray' for more")
    corpus = as_items(texts)
    if not corpus:
        raise AttnvizError("no texts to run; give at least one")
    t0 = time.perf_counter()
    session: RaySession | None = None
    try:
        lm, session, plan, ident = _prepare(model, engine, workers, ray_address, device, dtype, revision)
        ident.update(stack=stack or "default", max_tokens=max_tokens)
        name, n_workers = (lm.spec, 1) if lm is not None else (plan.ref.spec, plan.workers)
        root = Path(cache_root).expanduser() if cache_root is not None else None
        cache = AtlasCache.for_namespace(namespace(ident), root) if use_cache else None
        entries = _cached(cache, corpus) if cache is not None and not fresh else {}
        pending = _pending(corpus, entries)
        run = _Run(cache, len(entries) + len(pending), len(entries), progress, cancel, name, fresh)
        try:
            if lm is not None:
                weights = run.weights = fingerprint(lm)
                if cache is not None and not fresh:
                    cache.check_fingerprint(weights, name)
                stack_used: Stack = stack or lm.layout.stacks[0]
                run_local(lm, pending, stack=stack_used, max_tokens=max_tokens, weights=weights, sink=run)
            elif session is not None:
                session.run(plan, pending, stack=stack, max_tokens=max_tokens, sink=run)
        except KeyboardInterrupt as err:
            saved = cache.folder if cache is not None and not run.cache_error else None
            raise AtlasInterrupted(run.saved(), run.total, saved) from err
    finally:
        if session is not None:
            session.close()
    reused = len(entries)
    entries.update(run.entries)
    if progress is not None and not run.stopped:
        progress(run.total, run.total, "done")
    atlas = assemble(
        name, corpus, entries, cancelled=run.stopped, seconds=time.perf_counter() - t0,
        computed=run.computed, reused=reused, engine=engine, workers=n_workers, cache_error=run.cache_error,
    )  # fmt: skip
    log.info(
        "atlas model=%s engine=%s workers=%d texts=%d computed=%d reused=%d skipped=%d cancelled=%s "
        "seconds=%.2f", name, engine, n_workers, atlas.n_texts, run.computed, reused, len(atlas.skipped),
        run.stopped, atlas.seconds,
    )  # fmt: skip
    return atlas


def _prepare(model, engine, workers, ray_address, device, dtype, revision) -> tuple:
    """(the model loaded here, or the Ray session and plan; the cache identity of the model)."""
    if engine == "local":
        if isinstance(model, LoadedModel):
            lm = model
        else:
            lm = (
                model if isinstance(model, ModelRef) else ModelRef(str(model), device, dtype, revision)
            ).load()
        return lm, None, None, identity(lm.spec, revision, lm.device.type, dtype_name(lm.dtype))
    from .ray_engine import RaySession

    if isinstance(model, LoadedModel):
        ref = ref_of(model, revision)
    else:
        ref = model if isinstance(model, ModelRef) else ModelRef(str(model), device, dtype, revision)
    session = RaySession(ray_address)
    try:
        plan = session.plan(ref, workers)
    except BaseException:
        session.close()
        raise
    return None, session, plan, identity(ref.spec, ref.revision, plan.ref.device, plan.ref.dtype)


def _cached(cache: AtlasCache, corpus: Sequence[TextItem]) -> dict[str, Entry]:
    """The corpus's texts that have a sound entry in the cache (damaged ones count as missing)."""
    found: dict[str, Entry] = {}
    for item in corpus:
        if item.text is not None and item.key not in found:
            entry = cache.get(item.key)
            if entry is not None:
                found[item.key] = replace(entry, encoded=b"")
    return found


def _pending(corpus: Sequence[TextItem], done: dict[str, Entry]) -> list[TextItem]:
    """Texts to compute: readable, not done, each distinct text once (duplicates share a key)."""
    seen = set(done)
    pending = []
    for item in corpus:
        if item.text is not None and item.key not in seen:
            seen.add(item.key)
            pending.append(item)
    return pending


def _arr(a: np.ndarray | None) -> np.ndarray:
    assert a is not None  # entries that ran carry both arrays (checked when read)
    return a


def assemble(model: str, corpus: Sequence[TextItem], entries: dict[str, Entry], **extra) -> Atlas:
    """The atlas of ``corpus`` from its entries, in corpus order (texts with no entry yet, after a
    cancel, are left out; failed and unreadable ones are listed in ``skipped``)."""
    kept: list[TextItem] = []
    ok: list[Entry] = []
    skipped: list[tuple[int, str]] = []
    for item in corpus:
        entry = entries.get(item.key)
        if item.text is None:
            skipped.append((item.index, item.error))
        elif entry is not None and not entry.ok:
            skipped.append((item.index, entry.error))
        elif entry is not None:
            kept.append(item)
            ok.append(entry)
    first = ok[0] if ok else None
    n_l, n_h = first.values.shape[1:] if first is not None and first.values is not None else (0, 0)
    values = np.stack([_arr(e.values) for e in ok]) if ok else np.zeros((0, len(STATISTICS), n_l, n_h))
    return Atlas(
        model_name=model,
        stack=first.stack if first is not None else "self",  # type: ignore[arg-type]
        texts=tuple(str(it.text) for it in kept),
        tokens=tuple(e.tokens for e in ok),
        values={s: values[:, i] for i, s in enumerate(STATISTICS)},
        links=np.stack([_arr(e.links) for e in ok]) if ok else np.zeros((0, n_l, n_h, 3)),
        skipped=tuple(skipped),
        from_cache=extra["computed"] == 0 and extra["reused"] > 0,
        layer_labels=first.layer_labels if first is not None else (),
        indices=tuple(it.index for it in kept),
        keys=tuple(it.key for it in kept),
        **extra,
    )
