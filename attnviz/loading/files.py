"""Safe writes: every file attnviz writes is complete or absent, and every cache entry proves it.

- `atomic_write` / `atomic_write_text`: write a temporary file beside the target, fsync it, then
  `os.replace` it over the target (a reader sees the old file or the new one, never half of one);
- `build_folder`: a cache entry (a folder) filled in a temporary folder beside it, its manifest
  written last, then swapped in by rename; `check_folder` reads it back against that manifest;
- `folder_lock`: one writer per entry across processes (``flock``; released by the kernel when a
  process dies), so two processes converting the same model end with one good entry;
- `writing` / `cannot_write`: an ``OSError`` of a full disk, a read-only folder or a refused
  permission becomes one line (`CannotWrite`) that names the folder and the space needed.

The manifest (``manifest.json``) lists each file's size and SHA-256, the writer's version and the
source it was made from. A folder without one, or that does not match it, is not read: its owner
rebuilds it (or says which folder to remove).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from ..errors import AttnvizError, CannotWrite

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; entries are still swapped in atomically
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
STALE_SECONDS = 600  # a temporary file untouched this long belongs to a writer that died
WRITE_ERRNOS: dict[int, str] = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file is larger than this file system allows",
    errno.EROFS: "the folder is on a read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
ONLY_WRITES = (*_FULL, errno.EROFS)  # errors no read raises (permission errors may be reads)


# -- messages ------------------------------------------------------------------------------------
def size_text(n: int | None) -> str:
    """Bytes as people read them: 538.1 MB, 12.0 kB, 900 bytes."""
    if n is None:
        return "an unknown amount"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def existing_parent(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (where free space is measured)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int | None:
    """Free bytes on the file system that holds ``path`` (None when it cannot be measured)."""
    try:
        return shutil.disk_usage(existing_parent(path)).free
    except OSError:
        return None


def cannot_write(
    err: OSError,
    folder: Path,
    *,
    what: str,
    needed: int | None = None,
    hint: str = "",
    up_to: bool = False,
) -> CannotWrite:
    """One line for a failed write: what, which folder, why, the space needed (and free), the fix.
    ``up_to``: ``needed`` is an upper bound (a compressed file's uncompressed size)."""
    code = err.errno or 0
    reason = WRITE_ERRNOS.get(code) or (err.strerror or type(err).__name__)
    text = f"cannot write {what} to {str(folder)!r}: {reason}"
    need = f"it needs {'up to' if up_to else 'about'} {size_text(needed)}" if needed else ""
    if code in _FULL:
        text += f" ({need + ', ' if need else ''}{size_text(free_bytes(folder))} free there)"
        fix = "free some space there"
    else:
        text += f" ({need})" if need else ""
        fix = "make that folder writable"
    return CannotWrite(f"{text}; {fix}{' ' + hint if hint else ''}")


def error_number(err: BaseException) -> int | None:
    """The OS error number of ``err``: ``OSError.errno``, or the "(os error 28)" that Rust
    writers (safetensors, tokenizers) put in their messages instead of raising ``OSError``."""
    if isinstance(err, OSError):
        return err.errno
    found = _RUST_OS_ERROR.search(str(err))
    return int(found.group(1)) if found else None


def write_oserror(err: BaseException | None, codes: Iterable[int] = WRITE_ERRNOS) -> OSError | None:
    """The full-disk / read-only / permission error behind ``err`` (its causes included), as an
    ``OSError``; None when there is none."""
    seen, wanted = 0, set(codes)
    while err is not None and seen < 8:
        code = error_number(err)
        if code in wanted:
            return err if isinstance(err, OSError) else OSError(code, os.strerror(code))
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


@contextlib.contextmanager
def writing(
    folder: Path, *, what: str, needed: int | None = None, hint: str = "", up_to: bool = False
) -> Iterator[None]:
    """Turn a full disk / read-only / permission error raised inside (an ``OSError``, or a Rust
    writer's error that carries one) into `CannotWrite`; anything else passes through."""
    try:
        yield
    except AttnvizError:
        raise
    except Exception as err:
        disk = write_oserror(err)
        if disk is None:
            raise
        raise cannot_write(disk, folder, what=what, needed=needed, hint=hint, up_to=up_to) from None


def check_room(folder: Path, needed: int, *, what: str, hint: str = "") -> None:
    """Refuse before writing when the file system has less than ``needed`` bytes free."""
    free = free_bytes(folder)
    if free is not None and free < needed:
        raise cannot_write(OSError(errno.ENOSPC, "no space"), folder, what=what, needed=needed, hint=hint)


# -- single files --------------------------------------------------------------------------------
def _fsync_folder(folder: Path) -> None:
    """Make a rename inside ``folder`` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_stale(folder: Path, pattern: str) -> None:
    """Remove leftovers of writers that died (untouched for `STALE_SECONDS`)."""
    now = time.time()
    for old in folder.glob(pattern):
        with contextlib.suppress(OSError):
            if now - old.lstat().st_mtime > STALE_SECONDS:
                shutil.rmtree(old) if old.is_dir() else old.unlink()
                log.info("removed %s, left by a writer that stopped", old)


def replace_file(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """The raw atomic write (OSErrors pass through): temporary file beside ``path``, fsync, rename."""
    folder = path.parent
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_folder(folder)


def atomic_write(
    path: Path,
    write: Callable[[IO[bytes]], Any],
    *,
    what: str | None = None,
    needed: int | None = None,
    hint: str = "",
    up_to: bool = False,
) -> None:
    """Write ``path`` through ``write(file)`` into a temporary file beside it, fsync, then rename
    over ``path``: a failure (full disk, read-only folder, a crash) leaves the old file or none,
    and a full disk / read-only folder / refused permission is `CannotWrite` naming the folder."""
    path = Path(path)
    folder = path.parent
    with writing(folder, what=what or repr(path.name), needed=needed, hint=hint, up_to=up_to):
        folder.mkdir(parents=True, exist_ok=True)
        _remove_stale(folder, f".{path.name}.*.tmp")
        replace_file(path, write)


def atomic_write_bytes(path: Path, data: bytes, *, what: str | None = None, hint: str = "") -> None:
    atomic_write(path, lambda f: f.write(data), what=what, needed=len(data), hint=hint)


def atomic_write_text(path: Path, text: str, *, what: str | None = None, hint: str = "") -> None:
    atomic_write_bytes(path, text.encode("utf-8"), what=what, hint=hint)


# -- manifests -----------------------------------------------------------------------------------
def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path, *, version: str, source: str, name: str = MANIFEST) -> dict:
    """Hash and fsync every file in ``folder`` (sub-folders included), then write the manifest
    last, atomically. Returns what it wrote."""
    files: dict[str, dict[str, Any]] = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != name:
            with open(p, "rb") as f:
                os.fsync(f.fileno())
            files[p.relative_to(folder).as_posix()] = {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": version,
        "source": source,
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": files,
    }
    data = (json.dumps(manifest, indent=1) + "\n").encode("utf-8")
    replace_file(folder / name, lambda f: f.write(data))
    return manifest


def check_folder(
    folder: Path, *, version: str, source: str, deep: bool = True, name: str = MANIFEST
) -> str | None:
    """None when ``folder`` matches its manifest (and ``version`` / ``source``), else why not, as
    a phrase that follows the folder's name ("has no manifest", "is damaged: model.safetensors
    is 1,000 bytes; its manifest says ...").
    ``deep`` also compares every file's SHA-256 (never memoised: a file changed in place with its
    mtime put back is still caught); without it, only sizes."""
    folder = Path(folder)
    if not folder.is_dir():
        return "is missing" if not folder.exists() else "is not a folder"
    try:
        manifest = json.loads((folder / name).read_text(encoding="utf-8"))
        files: dict = manifest["files"]
        written_version, written_source = manifest["version"], manifest["source"]
    except FileNotFoundError:
        return "has no manifest (an older attnviz wrote it, or its writer stopped)"
    except (OSError, ValueError, KeyError, TypeError):
        return "has an unreadable manifest"
    if written_version != version:
        return f"was written by version {written_version!r} of its writer; this attnviz writes {version!r}"
    if written_source != source:
        return f"was made from {written_source!r}; this attnviz uses {source!r}"
    for rel, entry in sorted(files.items()):
        p = folder / rel
        try:
            size = p.stat().st_size
        except OSError:
            return f"is damaged: {rel} is missing"
        if size != entry["bytes"]:
            return f"is damaged: {rel} is {size:,} bytes; its manifest says {entry['bytes']:,}"
    if not deep:
        return None
    for rel, entry in sorted(files.items()):  # ~0.5 s for SmolLM2's 538 MB (SHA-NI), once per load
        try:
            digest = file_sha256(folder / rel)
        except OSError as err:
            return f"is damaged: {rel} cannot be read ({err.strerror or err})"
        if digest != entry["sha256"]:
            return f"is damaged: {rel} does not match its SHA-256 in the manifest"
    return None


# -- folders -------------------------------------------------------------------------------------
@contextlib.contextmanager
def folder_lock(target: Path) -> Iterator[bool]:
    """Hold the cross-process lock of the entry ``target`` (a ``.<name>.lock`` file beside it);
    yields False without a lock where none can be made (read-only folder, no ``fcntl``)."""
    lock = target.parent / f".{target.name}.lock"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits for the writer holding it; freed when it dies
        yield fcntl is not None
    finally:
        os.close(fd)


def remove_leftovers(target: Path) -> None:
    """Remove the temporary and replaced folders of ``target`` left by writers that died; call it
    while holding `folder_lock` (then no other writer is using them)."""
    for old in [*target.parent.glob(f".{target.name}.tmp-*"), *target.parent.glob(f".{target.name}.old-*")]:
        shutil.rmtree(old, ignore_errors=True)
        log.info("removed %s, left by a writer that stopped", old)


def discard(target: Path) -> None:
    """Remove the entry ``target`` (a damaged one, under `folder_lock`): renamed aside first, so
    no reader ever sees it half-removed; a folder that cannot be changed is left as it is."""
    aside = target.parent / f".{target.name}.old-{os.getpid()}-{time.monotonic_ns()}"
    try:
        os.rename(target, aside)
    except OSError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def _swap_in(tmp: Path, target: Path) -> None:
    """Rename the finished ``tmp`` to ``target``; a damaged ``target`` is moved aside first."""
    try:
        os.rename(tmp, target)
        return
    except OSError as err:
        if err.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
            raise
    old = target.parent / f".{target.name}.old-{os.getpid()}-{time.monotonic_ns()}"
    os.rename(target, old)
    os.rename(tmp, target)
    shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()


def build_folder(
    target: Path,
    fill: Callable[[Path], Any],
    *,
    version: str,
    source: str,
    what: str,
    needed: int | None = None,
    hint: str = "",
) -> Path:
    """Make the cache entry ``target``: ``fill(tmp)`` writes the files into a fresh temporary
    folder beside it, the manifest is written last, and the folder is renamed into place (replacing
    a damaged one). Any failure removes the temporary folder; full disk / read-only / permission
    errors become `CannotWrite` naming ``target``'s folder and ``needed`` bytes."""
    target = Path(target)
    parent = target.parent
    with writing(parent, what=what, needed=needed, hint=hint):
        parent.mkdir(parents=True, exist_ok=True)
        if needed:
            check_room(parent, needed, what=what, hint=hint)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=parent))
        try:
            os.chmod(tmp, 0o755)
            fill(tmp)
            write_manifest(tmp, version=version, source=source)
            _swap_in(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _fsync_folder(parent)
    return target
