"""The atlas's disk cache: one file per text, written the moment that text finishes.

Layout, under ``cache_dir()/atlas`` ($ATTNVIZ_CACHE/atlas, default ~/.cache/attnviz/atlas)::

    <namespace>/model.json                    manifest: model, settings, weights fingerprint, layers
    <namespace>/entries/<key[:2]>/<key>.entry one text's statistics and links, or why it failed

The namespace is a hash of everything that decides the numbers (`namespace`: model spec and
revision, device type, dtype, stack, token limit, format version); the key is the text's SHA-256
(`attnviz.atlas.corpus.text_key`). A run first reads the entries it needs and computes only the
missing ones, so an interrupted run resumes where it stopped.

What a reader and a fault test can rely on:

- **Atomic writes.** `AtlasCache.put` writes a temporary file in the entry's own folder
  (``.<key>.entry.<random>.tmp``), flushes and fsyncs it, then renames it over the entry with
  `os.replace`. A reader sees a whole entry or none; a writer killed half-way leaves at most a
  stray ``.tmp`` file, which no reader opens.
- **Damage is detected, never read.** An entry is the line ``attnviz-atlas-entry 1``, the SHA-256
  (hex) of the body, a newline, then the body (an uncompressed ``.npz``: statistics, links, and a
  JSON ``meta`` that repeats the key). `AtlasCache.get` re-hashes the body and checks the key, the
  array shapes and the finiteness of the statistics; on any mismatch (truncated, flipped bits,
  zero bytes, garbage, the wrong key, an unreadable file) the entry counts as missing: it is
  logged, counted in ``AtlasCache.damaged``, removed when the folder is writable, and the text is
  computed again.
- **A full or read-only disk is a message, not a crash.** `AtlasCache.put` raises
  `CacheWriteError` (a `CannotWrite`) naming the folder, the reason (no space left, read-only
  disk, permission denied) and the space needed (this entry, and the rest of the run at this
  entry's size); its temporary file is removed. `run_atlas` catches it once, keeps the rest of the
  run in memory, and returns the result with ``cache_error`` set: the command line prints it, the
  app shows it and keeps serving.
- **One set of weights per namespace.** The manifest records the weights fingerprint of the first
  writer; `AtlasCache.check_fingerprint` refuses (`OtherWeights`) when other weights would add
  entries under the same name, so entries of two models never mix.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AttnvizError, CannotWrite
from ..loading import cache_dir
from ..loading.files import atomic_write_bytes, free_bytes, size_text, write_oserror
from .ranking import STATISTICS

log = logging.getLogger(__name__)

CACHE_VERSION = 2  # 1 was one file per whole run (attnviz <= the Ray atlas)
MAGIC = b"attnviz-atlas-entry 1\n"


class CacheWriteError(CannotWrite):
    """The atlas cache folder cannot take an entry (full disk, read-only, no permission): a
    `CannotWrite` like every failed write, worded for the atlas (see `write_error`)."""


class OtherWeights(AttnvizError):
    """The cache holds results of other weights under this model's name (the model changed since):
    a run with ``fresh=True`` replaces them."""


class DamagedEntry(ValueError):
    """An entry's bytes do not check out (see the module doc)."""


@dataclass(frozen=True, eq=False)
class Entry:
    """One text's result: statistics and strongest links per head, or why it failed."""

    key: str
    tokens: tuple[str, ...] = ()  # display tokens
    values: np.ndarray | None = None  # float64 (statistics, layers, heads), STATISTICS order
    links: np.ndarray | None = None  # float64 (layers, heads, 3): query, key, weight
    error: str = ""  # why the text failed; "" when it ran
    final: bool = True  # False: a failure that may pass on a retry (kept out of the cache)
    fingerprint: str = ""  # weights fingerprint of the model that computed it
    layer_labels: tuple[str, ...] = ()
    stack: str = ""  # the stack whose layers these are ("self", "encoder", ...)
    encoded: bytes = field(default=b"", repr=False)  # the checked bytes it was decoded from

    @property
    def ok(self) -> bool:
        return not self.error


def namespace(identity: Mapping[str, Any]) -> str:
    """The cache folder name of one model + settings (see the module doc)."""
    blob = json.dumps({"version": CACHE_VERSION, **identity}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def encode(entry: Entry) -> bytes:
    """The bytes of an entry file: magic line, SHA-256 of the body, body (see the module doc)."""
    if entry.encoded:  # decoded from checked bytes (a Ray worker's): written as they came
        return entry.encoded
    meta = {
        "key": entry.key,
        "tokens": list(entry.tokens),
        "error": entry.error,
        "fingerprint": entry.fingerprint,
        "layer_labels": list(entry.layer_labels),
        "stack": entry.stack,
        "final": entry.final,
        "statistics": list(STATISTICS),
    }
    arrays: dict[str, Any] = {"meta": np.array(json.dumps(meta))}
    if entry.ok:
        assert entry.values is not None and entry.links is not None
        arrays.update(values=np.asarray(entry.values, np.float64), links=np.asarray(entry.links, np.float64))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    body = buf.getvalue()
    return MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def decode(data: bytes, key: str) -> Entry:
    """The entry in ``data``, or DamagedEntry saying what is wrong with it."""
    head = len(MAGIC) + 65
    if not data.startswith(MAGIC) or len(data) < head:
        raise DamagedEntry("not an atlas entry (bad header or truncated)")
    digest, body = data[len(MAGIC) : head - 1], data[head:]
    if data[head - 1 : head] != b"\n" or hashlib.sha256(body).hexdigest().encode() != digest:
        raise DamagedEntry("checksum mismatch (truncated or changed on disk)")
    try:
        with np.load(io.BytesIO(body), allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            values = z["values"] if "values" in z.files else None
            links = z["links"] if "links" in z.files else None
    except (OSError, ValueError, KeyError, EOFError) as err:
        raise DamagedEntry(f"unreadable body ({err})") from None
    if meta.get("key") != key:
        raise DamagedEntry(f"holds key {meta.get('key')!r}, not {key!r}")
    if meta.get("statistics") != list(STATISTICS):
        raise DamagedEntry("made with other statistics")
    if not meta["error"]:
        n_s = len(STATISTICS)
        if values is None or links is None or values.ndim != 3 or values.shape[0] != n_s:
            raise DamagedEntry("statistics missing or of the wrong shape")
        if links.shape != (*values.shape[1:], 3) or not np.isfinite(values).all():
            raise DamagedEntry("links of the wrong shape or statistics not finite")
    return Entry(
        key=key,
        tokens=tuple(meta["tokens"]),
        values=values,
        links=links,
        error=str(meta["error"]),
        fingerprint=str(meta["fingerprint"]),
        layer_labels=tuple(meta["layer_labels"]),
        stack=str(meta["stack"]),
        final=bool(meta["final"]),
        encoded=data,
    )


def write_error(
    err: OSError, folder: Path, size: int, remaining: int, what: str = "this text"
) -> CacheWriteError:
    """A one-line message for a failed cache write: the folder, why, and the space it needs."""
    need = f"{what} needs {size_text(size)}"
    if remaining:
        need += f", the other {remaining} texts about {size_text(size * remaining)}"
    where = "set ATTNVIZ_CACHE to a folder on another disk"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        free = free_bytes(folder)
        left = f" ({size_text(free)} free)" if free is not None else ""
        why = f"the disk of the atlas cache {str(folder)!r} is full{left}"
        return CacheWriteError(f"{why}: {need}; free some space or {where}")
    if err.errno == errno.EROFS:
        return CacheWriteError(f"the atlas cache {str(folder)!r} is on a read-only disk ({need}); {where}")
    if err.errno in (errno.EACCES, errno.EPERM):
        return CacheWriteError(f"no permission to write the atlas cache {str(folder)!r} ({need}); {where}")
    reason = err.strerror or type(err).__name__
    return CacheWriteError(f"cannot write the atlas cache {str(folder)!r}: {reason} ({need}); {where}")


class AtlasCache:
    """The entries of one namespace (see the module doc)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.damaged = 0  # entries found damaged (and treated as missing) by this object

    @classmethod
    def for_namespace(cls, name: str, root: Path | None = None) -> AtlasCache:
        return cls((root or cache_dir() / "atlas") / name)

    def entry_path(self, key: str) -> Path:
        return self.folder / "entries" / key[:2] / f"{key}.entry"

    def get(self, key: str) -> Entry | None:
        """The entry of ``key``; None when there is none or it is damaged (then it is removed)."""
        path = self.entry_path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            self.damaged += 1
            log.warning("atlas cache entry %s unreadable (%s); recomputing it", path, err)
            return None
        try:
            entry = decode(data, key)
            with contextlib.suppress(OSError):
                os.utime(path)  # recently used: kept longest by `evict`
            return entry
        except DamagedEntry as err:
            self.damaged += 1
            log.warning("atlas cache entry %s damaged (%s); recomputing it", path, err)
            with contextlib.suppress(OSError):
                path.unlink()
            return None

    def put(self, entry: Entry, *, remaining: int = 0) -> None:
        """Write an entry atomically; CacheWriteError when the folder cannot take it."""
        self._write(self.entry_path(entry.key), encode(entry), remaining, "this text")

    def manifest(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.folder / "model.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def write_manifest(self, manifest: Mapping[str, Any]) -> None:
        data = json.dumps(dict(manifest), indent=1, sort_keys=True).encode()
        self._write(self.folder / "model.json", data, 0, "the manifest model.json")

    def _write(self, path: Path, data: bytes, remaining: int, what: str) -> None:
        """`attnviz.loading.files.atomic_write_bytes`, the one atomic write (a temporary file
        beside ``path``, fsync, rename); its failure worded for the atlas (`write_error`)."""
        try:
            atomic_write_bytes(path, data)
        except (CannotWrite, OSError) as err:
            disk = err if isinstance(err, OSError) else write_oserror(err)
            disk = disk or OSError(errno.EIO, str(err))
            raise write_error(disk, self.folder, len(data), remaining, what=what) from None

    def check_fingerprint(self, fingerprint: str, model: str) -> None:
        """Refuse when the manifest names other weights than ``fingerprint`` (see the module doc)."""
        m = self.manifest()
        if m and m.get("fingerprint") and fingerprint and m["fingerprint"] != fingerprint:
            raise OtherWeights(
                f"the atlas cache {str(self.folder)!r} holds results of other weights under the name "
                f"{model!r} (the model changed since); delete that folder, or run with --fresh"
            )


def evict(max_bytes: int, root: Path | None = None) -> int:
    """Delete the least recently used entries of every namespace under ``root`` (default
    ``cache_dir()/atlas``) until they take at most ``max_bytes``; returns how many went. A public
    demo calls it after each run, so its disk cache stays bounded. An entry that vanishes
    meanwhile (another process evicting) is skipped."""
    entries = []
    for path in (root or cache_dir() / "atlas").glob("*/entries/*/*.entry"):
        with contextlib.suppress(OSError):
            st = path.stat()
            entries.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in entries)
    gone = 0
    for _, size, path in sorted(entries):
        if total <= max_bytes:
            break
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            gone += 1
        total -= size
    if gone:
        log.info("atlas cache: evicted %d least recently used entries (budget %d bytes)", gone, max_bytes)
    return gone
