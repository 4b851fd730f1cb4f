"""The container's health check: Streamlit answers, and the demo's queue is moving.

Standard library only, and runnable by its path (``python attnviz/server/healthcheck.py URL``),
so a check every few seconds never imports torch. Exit 0 when healthy, 1 when not; the one line
it prints is what ``docker inspect`` shows an operator (the queue length and the oldest ticket's
age, from the status file the demo gate's watchdog rewrites, `InferenceGate.start_watchdog`).

Unhealthy: the URL does not answer 200, or the status file (``ATTNVIZ_STATUS_FILE``) has not been
rewritten for longer than it says it may go, or it shows a run held past the point where the
watchdog should have released it. No file is healthy: the server is not a demo, or no visitor has
come yet (``attnviz app`` removes a previous run's file before it starts the server).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

STATUS_FILE_ENV = "ATTNVIZ_STATUS_FILE"


def read_status(path: Path) -> dict | None:
    """The status file's contents, or None when there is none (yet)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def verdict(status: dict | None, now: float) -> tuple[bool, str]:
    """(healthy, one line) for a status file's contents at wall time ``now``."""
    if status is None:
        return True, "ok (no queue status: not a demo server, or no visitor yet)"
    age = now - float(status["updated"])
    if age > float(status["stale_after"]):
        return False, f"the demo queue's watchdog has not reported for {age:.0f} s: the server looks stuck"
    running, stuck_after = status.get("running_for"), status.get("stuck_after")
    if running is not None and stuck_after is not None and running > stuck_after + status["every"]:
        return False, f"a run has held the demo queue for {running:.0f} s, not released: {status['line']}"
    return True, f"ok · {status['line']}"


def check(url: str, status_file: Path | None, now: float | None = None) -> tuple[bool, str]:
    """(healthy, one line): ``url`` answers 200, then the queue's status file says it moves."""
    try:
        with urllib.request.urlopen(url, timeout=4) as response:
            if response.status != 200:
                return False, f"{url} answered {response.status}"
    except OSError as err:
        return False, f"{url} does not answer ({err})"
    if status_file is None:
        return True, "ok"
    try:
        status = read_status(status_file)
    except (OSError, ValueError, KeyError) as err:
        return False, f"cannot read the queue status {status_file} ({err})"
    try:
        return verdict(status, time.time() if now is None else now)
    except (KeyError, TypeError, ValueError) as err:
        return False, f"the queue status {status_file} is malformed ({err})"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    url = args[0] if args else "http://127.0.0.1:8501/_stcore/health"
    named = os.environ.get(STATUS_FILE_ENV, "").strip()
    ok, line = check(url, Path(named) if named else None)
    sys.stdout.write(line + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
