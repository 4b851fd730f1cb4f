"""SIGUSR1 diagnostics for an app server started by a harness (never the app itself).

A harness writes `sitecustomize` (the text `hook` returns) into a folder on the server's
PYTHONPATH; in the server, SIGUSR1 then writes what the process holds, as JSON, to the file that
the named environment variable gives: the results cache, the Streamlit sessions and the
`AttentionResult` objects still alive. Shared by scripts/demo_soak.py and tests/server.py.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any


def hook(path_var: str, *, caches: str = "results") -> str:
    """The sitecustomize text: install `dump` on SIGUSR1, writing to ``$path_var``. ``caches``:
    "results" (entries, MiB, evictions) or "all" (results and derived caches, and the gate)."""
    return (
        f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        f"import server_diag\nserver_diag.install({path_var!r}, caches={caches!r})\n"
    )


def install(path_var: str, *, caches: str = "results") -> None:
    signal.signal(signal.SIGUSR1, lambda signum, frame: dump(os.environ[path_var], caches=caches))


def dump(path: str, *, caches: str = "results") -> None:
    """What the process holds, written atomically to ``path``."""
    out: dict[str, Any] = {}
    models = sys.modules.get("ui.models")
    if models is not None:
        if caches == "all":
            for name, cache in (("results", models.results_cache()), ("derived", models._derived())):
                out[name] = {"entries": len(cache), "mib": cache.total_bytes / 2**20}
            out["gate"] = vars(sys.modules["ui.gate"].status())  # queue length, oldest ticket, run times
        else:
            cache = models.results_cache()
            out["results"] = {"entries": len(cache), "mib": cache.total_bytes / 2**20,
                              "evictions": getattr(cache, "evictions", None)}  # fmt: skip
    try:
        from streamlit.runtime import Runtime

        mgr = Runtime.instance()._session_mgr
        out["sessions_active"] = len(mgr.list_active_sessions())
        out["sessions_kept"] = len(mgr.list_sessions())
    except Exception as err:  # noqa: BLE001 - diagnostics only
        out["sessions_error"] = repr(err)
    gc.collect()
    result_type = getattr(sys.modules.get("attnviz.result"), "AttentionResult", None)
    if result_type is not None:
        out["results_alive"] = sum(1 for o in gc.get_objects() if isinstance(o, result_type))
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)


def ask(pid: int, path: Path, timeout: float = 30) -> dict | None:
    """Signal the server ``pid`` and read what it wrote to ``path``; None if it does not answer
    within ``timeout`` seconds."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_mtime_ns != before:
            with contextlib.suppress(json.JSONDecodeError):
                return json.loads(path.read_text())
        time.sleep(0.1)
    return None
