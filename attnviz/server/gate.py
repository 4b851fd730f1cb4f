"""A first-come-first-served gate: one inference at a time, with visible queue positions.

The hosted demo's one queue. Every path that runs the model goes through it: the app takes a
`InferenceGate.turn` around each heavy action (with the position shown), and a demo server also
puts the gate into each shared model's ``lock`` (`GatedLock`), so engine code that takes
``lm.lock`` queues here too; a turn is reentrant per thread, so the two never queue twice.

Rules that keep it from jamming (issue 34):

- A ticket is removed by one ``finally`` that covers the whole wait and the whole run: an
  exception anywhere (``on_wait`` raising because the visitor left, a stop, an error in the run)
  leaves no ticket behind.
- ``on_wait(position)`` is called at every poll (not only when the position changes), so a
  caller whose visitor has gone finds out within ``poll_seconds`` and leaves the queue.
- One pending request per visitor: a new request from a visitor who already waits takes that
  request's place, and the older one leaves with `Superseded`.
- ``max_queue`` waiting requests at most (`QueueFull`); a turn's `Turn.check` raises `RunTooLong`
  once the run is past ``run_limit`` (callers call it from their progress callbacks).
- A watchdog (`sweep`, or `start_watchdog` for a thread that calls it) removes tickets whose
  thread has ended and releases a holder that is far past ``run_limit`` (``stuck_after``), with
  an error in the log: a stuck gate becomes a logged error and a moving queue, never a silent hang.
  The model's own lock still keeps two forwards apart; a released holder's nested turns never
  queue (they would wait behind the next holder, who waits for the model lock it holds).
- A wait that names no ``on_wait`` (engine code taking a `GatedLock`) asks ``unnamed_waits``, which
  the app sets: on a page, it is shown and counted per visitor like the app's own turns.
- `status` is what an operator sees: queue length, the oldest ticket's age, how long the current
  run has held the gate and the recent run times (also `status().line()` in the log).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import AttnvizError
from .queue_status import GateStatus, write_status

log = logging.getLogger(__name__)

RECENT_RUNS = 20  # run times kept for the wait estimate, per kind of hold
# What holds the gate: a page's run (a model run: `acquire`'s default) or engine code's `lm.lock`
# taken outside one (a self-check, a short read: milliseconds). Their times are kept apart: mixed,
# the short holds made the median "typical run 0.0 s" and a 17 s wait read "about 1 s".
RUN, LOCK = "run", "lock"


# (on_wait, done, visitor) of a wait that engine code starts: ``done()`` once the turn starts
UnnamedWait = tuple[Callable[[int], None], Callable[[], None], Hashable | None]


class QueueFull(AttnvizError):
    """The demo's queue is at its cap; the request was not queued."""


class Superseded(AttnvizError):
    """The same visitor made a newer request, which took this one's place in the queue."""


class RunTooLong(AttnvizError):
    """A run went past the demo's time limit per run and was stopped."""


@dataclass
class _Ticket:
    number: int
    visitor: Hashable | None
    thread: threading.Thread
    joined: float
    started: float | None = None
    kind: str = RUN  # RUN or LOCK: whose recent times estimate this ticket's hold
    depth: int = 0  # nested turns of the holder's own thread
    superseded: bool = False


@dataclass
class Turn:
    """The caller's turn: `check` raises `RunTooLong` once the run is past the limit."""

    gate: InferenceGate
    ticket: _Ticket = field(repr=False)

    def check(self) -> None:
        limit = self.gate.run_limit
        started = self.ticket.started
        if limit is None or started is None:
            return
        spent = self.gate.clock() - started
        if spent > limit:
            raise RunTooLong(
                f"this run took more than the demo's limit of {limit:.0f} s per run and was stopped; "
                "try a shorter text (the model is free for the next visitor)"
            )


class InferenceGate:
    """FIFO mutual exclusion. Waiters learn their position (1 = next) while they wait.

    >>> gate = InferenceGate()
    >>> with gate.turn(on_wait=lambda pos: None):
    ...     pass
    """

    def __init__(
        self,
        *,
        max_queue: int = 0,
        run_limit: float | None = None,
        stuck_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_queue = max_queue
        self.run_limit = run_limit
        # a holder past this is released by the watchdog (default: twice the limit + 30 s)
        self.stuck_after = (
            stuck_after if stuck_after is not None else (None if run_limit is None else 2 * run_limit + 30)
        )
        self.clock = clock
        self._cond = threading.Condition()
        self._queue: list[_Ticket] = []  # [0] holds the gate once started
        self._numbers = itertools.count()
        self._recent: dict[str, deque[float]] = {k: deque(maxlen=RECENT_RUNS) for k in (RUN, LOCK)}
        self._released_stuck = 0
        self._removed_dead = 0
        self._holding: dict[threading.Thread, _Ticket] = {}  # running threads' tickets, released ones too
        self._watchdog: threading.Thread | None = None
        # how a wait that names no ``on_wait`` (a `GatedLock` taken by engine code) is shown: set
        # by the app; returns (on_wait, done, visitor) for the calling thread, or None
        self.unnamed_waits: Callable[[], UnnamedWait | None] | None = None

    # -- reading ------------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """How many requests are queued behind the one running."""
        with self._cond:
            return max(len(self._queue) - 1, 0)

    def status(self) -> GateStatus:
        with self._cond:
            now = self.clock()
            head = self._queue[0] if self._queue else None
            running = None if head is None or head.started is None else now - head.started
            waiters = [t for t in self._queue if t.started is None]
            return GateStatus(
                waiting=max(len(self._queue) - 1, 0),
                running_for=running,
                oldest_wait=max((now - t.joined for t in waiters), default=0.0),
                typical_run=self._typical(RUN),
                max_queue=self.max_queue,
                run_limit=self.run_limit,
                released_stuck=self._released_stuck,
                removed_dead=self._removed_dead,
            )

    def _typical(self, kind: str) -> float | None:
        """The median of the recent holds of ``kind`` (caller holds the lock or reads once)."""
        recent = self._recent[kind]
        return statistics.median(recent) if recent else None

    def estimate(self, position: int) -> float | None:
        """Seconds until a request at ``position`` (1 = next) starts: what the holder has left of
        its kind's typical hold, plus the typical hold of each ticket ahead by its kind (a run's,
        or an engine lock's); positions past the queue count as runs. None before a run finished."""
        with self._cond:
            run = self._typical(RUN)
            if run is None:
                return None
            now = self.clock()
            wait = 0.0
            for i in range(max(position, 1)):
                ticket = self._queue[i] if i < len(self._queue) else None
                kind = RUN if ticket is None else ticket.kind
                typical = self._typical(kind) or (0.0 if kind == LOCK else run)
                if ticket is not None and ticket.started is not None:
                    typical = max(typical - (now - ticket.started), 0.0)  # the holder: what is left
                wait += typical
            return wait

    # -- taking a turn ------------------------------------------------------------------------

    @contextlib.contextmanager
    def turn(
        self,
        on_wait: Callable[[int], None] | None = None,
        *,
        visitor: Hashable | None = None,
        poll_seconds: float = 0.5,
    ) -> Iterator[Turn]:
        """Wait for the gate, then hold it for the ``with`` block. ``on_wait(position)`` is called
        at every poll while waiting (an exception from it leaves the queue and propagates).
        ``visitor`` (a session id) allows one pending request per visitor. Reentrant per thread."""
        turn = self.acquire(on_wait, visitor=visitor, poll_seconds=poll_seconds)
        try:
            yield turn
        finally:
            self.release(turn)

    def acquire(
        self,
        on_wait: Callable[[int], None] | None = None,
        *,
        visitor: Hashable | None = None,
        poll_seconds: float = 0.5,
        kind: str = RUN,
    ) -> Turn:
        """`turn` without the ``with``: every `acquire` needs one `release` of what it returned.
        ``kind``: RUN (a page's model run) or LOCK (engine code's ``lm.lock``), for the estimate."""
        me = threading.current_thread()
        with self._cond:
            held = self._holding.get(me)
            if held is not None:
                held.depth += 1  # this thread already holds the gate (a nested turn)
                return Turn(self, held)
        done: Callable[[], None] | None = None
        if on_wait is None and visitor is None and self.unnamed_waits is not None:
            shown = self.unnamed_waits()  # engine code's wait, on a page: shown there like a turn's
            if shown is not None:
                on_wait, done, visitor = shown
        with self._cond:
            ticket = self._enqueue(me, visitor, kind)
        try:
            while True:
                with self._cond:
                    self._drop_dead()
                    if ticket.superseded:
                        raise Superseded("a newer request from this visitor took this one's place")
                    position = self._queue.index(ticket)
                    if position == 0:
                        ticket.started = self.clock()
                        self._holding[me] = ticket
                        break
                if on_wait is not None:
                    on_wait(position)  # outside the lock: it may draw, block or raise
                with self._cond:
                    if self._queue and self._queue[0] is not ticket and not ticket.superseded:
                        self._cond.wait(poll_seconds)
            if done is not None:
                done()  # inside the try: if it raises, the ticket still goes
        except BaseException:
            self._remove(ticket)
            raise
        return Turn(self, ticket)

    def release(self, turn: Turn) -> None:
        ticket = turn.ticket
        with self._cond:
            if ticket.depth:
                ticket.depth -= 1
                return
        self._remove(ticket)

    def _enqueue(self, me: threading.Thread, visitor: Hashable | None, kind: str = RUN) -> _Ticket:
        """A new ticket (caller holds the lock): in the place of this visitor's waiting request,
        else at the end if the queue has room."""
        ticket = _Ticket(next(self._numbers), visitor, me, self.clock(), kind=kind)
        if visitor is not None:
            for i, old in enumerate(self._queue):
                if old.visitor == visitor and old.started is None and not old.superseded:
                    old.superseded = True
                    self._queue[i] = ticket
                    self._cond.notify_all()
                    return ticket
        if self.max_queue and len(self._queue) - 1 >= self.max_queue:
            log.warning("gate: queue full (%d waiting); a request was refused", len(self._queue) - 1)
            raise QueueFull(
                f"the demo's queue is full ({self.max_queue} requests waiting); please try again in a minute"
            )
        self._queue.append(ticket)
        return ticket

    def _remove(self, ticket: _Ticket) -> None:
        with self._cond:
            self._holding = {th: t for th, t in self._holding.items() if t is not ticket}
            if ticket in self._queue:
                self._queue.remove(ticket)
                if ticket.started is not None:
                    self._recent[ticket.kind].append(self.clock() - ticket.started)
            self._cond.notify_all()

    # -- the watchdog -------------------------------------------------------------------------

    def _drop_dead(self) -> None:
        """Remove tickets whose thread has ended (caller holds the lock): a ticket can only be
        left behind by a bug; this is the net under the ``finally``."""
        dead = [t for t in self._queue if not t.thread.is_alive()]
        self._holding = {th: t for th, t in self._holding.items() if th.is_alive()}
        for t in dead:
            log.error(
                "gate: ticket %d of an ended thread %r was still queued; removed", t.number, t.thread.name
            )
            self._queue.remove(t)
            self._removed_dead += 1
        if dead:
            self._cond.notify_all()

    def sweep(self) -> GateStatus:
        """One watchdog pass: drop dead tickets, release a holder past ``stuck_after``; returns
        the status after it."""
        with self._cond:
            self._drop_dead()
            head = self._queue[0] if self._queue else None
            if head is not None and head.started is not None and self.stuck_after is not None:
                held = self.clock() - head.started
                if held > self.stuck_after:
                    log.error(
                        "gate: the running request (ticket %d, thread %r) has held the gate for %.0f s, "
                        "past %.0f s (limit per run %s s); released so the queue moves on",
                        head.number,
                        head.thread.name,
                        held,
                        self.stuck_after,
                        self.run_limit,
                    )
                    self._queue.pop(0)
                    self._released_stuck += 1
                    self._cond.notify_all()
        return self.status()

    def start_watchdog(
        self, interval: float = 5.0, log_every: float = 60.0, status_file: Path | None = None
    ) -> None:
        """A daemon thread that calls `sweep` every ``interval`` s and logs the status line every
        ``log_every`` s while anything is queued or running (once per gate; later calls no-op).
        With ``status_file``, each pass also rewrites it (`write_status`) for the health check."""
        with self._cond:
            if self._watchdog is not None:
                return
            args = (interval, log_every, status_file)
            self._watchdog = threading.Thread(target=self._watch, args=args, name="attnviz-gate-watchdog")
            self._watchdog.daemon = True
        self._watchdog.start()

    def _watch(self, interval: float, log_every: float, status_file: Path | None) -> None:
        logged = 0.0
        if status_file is not None:
            write_status(status_file, self.status(), interval, self.stuck_after)
        while True:
            time.sleep(interval)
            try:
                st = self.sweep()
                now = time.monotonic()
                if (st.waiting or st.running_for is not None) and now - logged >= log_every:
                    log.info(st.line())
                    logged = now
                if status_file is not None:
                    write_status(status_file, st, interval, self.stuck_after)
            except Exception:
                log.exception("gate watchdog pass failed")

    def lock(self, inner: Any) -> GatedLock:
        """A lock for a shared model: taking it takes a turn of this gate, then ``inner``."""
        return GatedLock(self, inner)


class GatedLock:
    """``lm.lock`` of a demo server: a turn of the gate (reentrant per thread), then the model's
    own lock. Engine code that takes ``lm.lock`` queues at the gate like the app's pages do."""

    def __init__(self, gate: InferenceGate, inner: Any) -> None:
        self.gate, self.inner = gate, inner
        self._held = threading.local()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        turn = self.gate.acquire(kind=LOCK)
        try:
            ok = self.inner.acquire(blocking, timeout)
        except BaseException:
            self.gate.release(turn)
            raise
        if not ok:
            self.gate.release(turn)
            return False
        self._stack().append(turn)
        return True

    def release(self) -> None:
        turn = self._stack().pop()
        self.inner.release()
        self.gate.release(turn)

    def _stack(self) -> list[Turn]:
        if not hasattr(self._held, "turns"):
            self._held.turns = []
        return self._held.turns

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
