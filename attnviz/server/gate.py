"""A first-come-first-served gate: one inference at a time, with visible queue positions."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator


class InferenceGate:
    """FIFO mutual exclusion. Waiters learn their position (1 = next) while they wait.

    >>> gate = InferenceGate()
    >>> with gate.turn(on_wait=lambda pos: None):
    ...     pass
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: list[int] = []
        self._tickets = itertools.count()

    @property
    def waiting(self) -> int:
        """How many requests are queued behind the one running."""
        with self._cond:
            return max(len(self._queue) - 1, 0)

    @contextlib.contextmanager
    def turn(self, on_wait: Callable[[int], None] | None = None, poll_seconds: float = 0.5) -> Iterator[None]:
        ticket = next(self._tickets)
        with self._cond:
            self._queue.append(ticket)
            last = -1
            while self._queue[0] != ticket:
                position = self._queue.index(ticket)
                if on_wait is not None and position != last:
                    on_wait(position)
                    last = position
                self._cond.wait(poll_seconds)
        try:
            yield
        finally:
            with self._cond:
                self._queue.remove(ticket)
                self._cond.notify_all()
