"""What an operator sees of the demo's queue: `GateStatus` (a log line) and the status file
that `attnviz.server.healthcheck` reads."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import AttnvizError
from ..loading.files import atomic_write_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GateStatus:
    """What the gate is doing now (seconds from the gate's clock)."""

    waiting: int  # requests queued behind the one running
    running_for: float | None  # how long the current holder has held the gate; None when idle
    oldest_wait: float  # age of the oldest waiting ticket (0 when none waits)
    typical_run: float | None  # median of the recent run times
    max_queue: int  # 0 = no cap
    run_limit: float | None
    released_stuck: int = 0  # holders the watchdog released since start
    removed_dead: int = 0  # tickets of ended threads the watchdog removed

    def line(self) -> str:
        """One log line."""
        run = "idle" if self.running_for is None else f"running for {self.running_for:.1f} s"
        typical = "n/a" if self.typical_run is None else f"{self.typical_run:.1f} s"
        return (
            f"gate: {run}, {self.waiting} waiting (cap {self.max_queue or 'none'}), oldest ticket "
            f"{self.oldest_wait:.1f} s, typical run {typical}, stuck released {self.released_stuck}, "
            f"dead removed {self.removed_dead}"
        )


def write_status(path: Path, status: GateStatus, every: float, stuck_after: float | None) -> None:
    """The gate's status as JSON for `attnviz.server.healthcheck` (written whole or not at all):
    the status, its one line, when it was written (wall time) and how long it may go unwritten."""
    data = {
        **dataclasses.asdict(status),
        "line": status.line(),
        "updated": time.time(),
        "every": every,
        "stale_after": max(30.0, 6 * every),
        "stuck_after": stuck_after,
        "pid": os.getpid(),
    }
    try:
        atomic_write_text(path, json.dumps(data), what="the demo queue's status file")
    except AttnvizError as err:  # a full or read-only disk: the queue goes on, the log says why
        log.warning("%s", err)
