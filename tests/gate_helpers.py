"""Helpers the demo-queue tests share (engine and app): a thread holding the gate, and waiting on
a condition rather than a delay."""

from __future__ import annotations

import threading
import time

from attnviz.server.gate import InferenceGate


def hold(gate: InferenceGate, seconds: float = 60.0) -> tuple[threading.Thread, threading.Event]:
    """A thread holding the gate until the returned event is set (or ``seconds`` pass)."""
    inside, release = threading.Event(), threading.Event()

    def run():
        with gate.turn():
            inside.set()
            release.wait(seconds)

    t = threading.Thread(daemon=True, target=run)
    t.start()
    assert inside.wait(5)
    return t, release


def until(condition, timeout: float = 30.0) -> None:
    """Wait for ``condition()`` to hold (polling a condition; the outcome never rides on a delay)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.001)
