"""Fault injection for tests/test_faults*.py.

- Real mounts where this process may mount (root with CAP_SYS_ADMIN, as here): `tmpfs` (a small
  file system that runs out of space for real: the kernel answers ENOSPC) and `read_only` (a
  read-only bind mount: the kernel answers EROFS even to root, whom chmod does not stop).
- `fill`: leave a chosen number of bytes free on a tmpfs.
- `tiny_converter`: the built-in SmolLM2 entry made through the real cache code (manifest, lock,
  rename, verification, rebuild, in-memory fallback) from the tiny Llama of tests/tiny.py instead of
  the 20-second GGUF de-quantization, so every cache fault runs in well under a second.
- ``python tests/faults.py worker ...``: the same in a separate process, for kills and races.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TEXT = "the financial bank is located on river bank"


# -- mounts --------------------------------------------------------------------------------------
def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


@functools.cache
def can_mount() -> bool:
    """Whether this process may mount a tmpfs (tried once, in a scratch folder)."""
    with tempfile.TemporaryDirectory() as scratch:
        if _run("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", scratch).returncode != 0:
            return False
        _run("umount", scratch)
    return True


def _umount(path: Path) -> None:
    if _run("umount", str(path)).returncode != 0:
        _run("umount", "-l", str(path))


@contextlib.contextmanager
def tmpfs(path: Path, size: int) -> Iterator[Path]:
    """A fresh tmpfs of ``size`` bytes mounted on ``path`` (created), unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    done = _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path))
    assert done.returncode == 0, done.stderr
    try:
        yield path
    finally:
        _umount(path)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """``path`` (an existing folder) bind-mounted read-only onto itself, unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    done = _run("mount", "--bind", str(path), str(path))
    assert done.returncode == 0, done.stderr
    try:
        done = _run("mount", "-o", "remount,bind,ro", str(path))
        assert done.returncode == 0, done.stderr
        yield path
    finally:
        _umount(path)


def fill(folder: Path, leave: int) -> None:
    """Write a filler file so that about ``leave`` bytes stay free on ``folder``'s file system."""
    import shutil

    free = shutil.disk_usage(folder).free
    block = b"\0" * 4096
    with open(folder / "filler", "wb") as f:
        for _ in range(max(0, free - leave) // 4096):
            try:
                f.write(block)
            except OSError:
                break


# -- a stand-in converter ------------------------------------------------------------------------
class TinyConverter:
    """Patches `attnviz.loading.convert` so that "converting SmolLM2" builds the tiny Llama (a fresh
    copy each time, like a real conversion); counts conversions. ``pause`` sleeps inside the
    conversion (for races); ``stall`` makes the write stop forever after the weights (for kills),
    touching ``stall`` first so a test knows the moment."""

    def __init__(self, package: Path, pause: float = 0.0, stall: Path | None = None) -> None:
        self.package, self.pause, self.stall, self.calls = package, pause, stall, 0

    def convert(self, gguf_dir: Path):
        import tiny

        assert gguf_dir == self.package
        self.calls += 1
        time.sleep(self.pause)
        model = copy.deepcopy(tiny.model("llama-gqa"))
        if self.stall is not None:
            save, stall = model.save_pretrained, self.stall

            def stalled(folder, *args, **kwargs):
                save(folder, *args, **kwargs)
                stall.write_text(str(folder))
                time.sleep(600)  # killed here

            model.save_pretrained = stalled
        return model, tiny.tokenizer()

    def install(self, setattr_) -> TinyConverter:
        from attnviz.loading import convert

        setattr_(convert, "convert_in_memory", self.convert)
        setattr_(convert, "_package_folder", lambda: self.package)
        return self


def attention_checksum(lm) -> float:
    import attnviz

    res = attnviz.extract(lm, TEXT)
    return float(sum(res.layer(i).astype("float64").sum() * (i + 1) for i in range(res.n_layers())))


# -- a worker process ----------------------------------------------------------------------------
def start_worker(cache: Path, *args: str, real: bool = False, gate: Path | None = None) -> subprocess.Popen:
    """``load_model("smollm2-135m")`` in a new process with ATTNVIZ_CACHE=cache (the tiny
    converter unless ``real``); it prints one JSON line: notices, conversions, checksum. With
    ``gate`` it writes ``gate/ready-<pid>`` once imported and loads when ``gate/go`` exists."""
    env = {
        **os.environ,
        "FAULTS_GATE": str(gate or ""),
        "ATTNVIZ_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "TQDM_DISABLE": "1",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}",
    }
    cmd = [sys.executable, str(HERE / "faults.py"), "worker", "real" if real else "tiny", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_together(n: int, cache: Path, gate: Path, *args: str, real: bool = False) -> list:
    """``n`` workers that start loading at the same moment (once all ``n`` have imported)."""
    gate.mkdir(parents=True, exist_ok=True)
    procs = [start_worker(cache, *args, real=real, gate=gate) for _ in range(n)]
    t0 = time.monotonic()
    while len(list(gate.glob("ready-*"))) < n:
        assert time.monotonic() - t0 < 300 and all(p.poll() is None for p in procs), "a worker stopped"
        time.sleep(0.05)
    (gate / "go").touch()
    return procs


def _worker(argv: list[str]) -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("transformers", "httpx", "urllib3", "filelock", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import attnviz

    conv = None
    if argv[0] == "tiny":
        pause = float(argv[1]) if len(argv) > 1 else 0.0
        stall = Path(argv[2]) if len(argv) > 2 and argv[2] != "-" else None
        conv = TinyConverter(Path(os.environ["ATTNVIZ_CACHE"]).parent, pause, stall).install(setattr)
    gate = os.environ.get("FAULTS_GATE")
    if gate:
        (Path(gate) / f"ready-{os.getpid()}").touch()
        while not (Path(gate) / "go").exists():
            time.sleep(0.01)
    lm = attnviz.load_model("smollm2-135m", device="cpu")
    out = {
        "notices": list(lm.notices),
        "conversions": conv.calls if conv else None,
        "checksum": attention_checksum(lm),
    }
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        _worker(sys.argv[2:])
