"""The demo gate (`attnviz.server.gate.InferenceGate`) as a Hypothesis state machine.

Each visitor is a real thread that takes a turn the way a page does (`InferenceGate.acquire` with
an ``on_wait`` that raises once the visitor has gone, then `release` in a ``finally``). The rules
drive them: join (with or without a visitor id; a join by a visitor who already waits supersedes
that request; a join past the cap is refused), leave while waiting, finish or leave while running,
a nested turn, the holder's thread ending without releasing (the bug the watchdog is the net
for), the clock moving (the gate's clock is the machine's) and the watchdog's sweep. After every
rule the machine waits until the threads have settled, then checks that the gate's queue is the
model's queue.

Invariants:
- the queue is the model's, in order: first come first served, apart from a superseded request
  whose newer one takes its place;
- no ticket without a live waiter: every ticket belongs to a thread that waits or runs, apart
  from an ended holder's, and that one only until the next waiter's poll or the watchdog's sweep;
- one pending request per visitor;
- the cap is never exceeded;
- the estimate is never negative and follows the recorded run times (the median of the last
  runs; an abandoned wait, a superseded request, a dead or stuck holder record none).
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from dataclasses import dataclass, field

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from property_settings import examples, slow_settings

from attnviz.server.gate import LOCK, RECENT_RUNS, RUN, InferenceGate, QueueFull, Superseded

POLL = 0.003  # the waiters' poll (seconds): how soon a visitor who left is noticed
SETTLE = 5.0  # seconds a rule may take to settle (a busy machine) before it is a failure
RUN_LIMIT = 10.0
STUCK_AFTER = 50.0


class Left(Exception):
    """The visitor closed the tab (what the page's on_wait raises)."""


@dataclass(eq=False)
class Visitor:
    """One request: a thread that waits for its turn, then runs until told what to do."""

    name: int
    visitor: str | None
    gate: InferenceGate
    kind: str = RUN  # a page's run, or engine code's lm.lock (kept apart for the estimate)
    leave: threading.Event = field(default_factory=threading.Event)
    commands: queue.Queue = field(default_factory=queue.Queue)
    outcome: str = "waiting"  # waiting, running, left, superseded, full, finished, dead
    depth: int = 0  # nested turns the thread holds now
    acked: int = 0  # commands done
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name=f"visitor-{self.name}", daemon=True)
        self.thread.start()

    def on_wait(self, position: int) -> None:
        assert position >= 1
        if self.leave.is_set():
            raise Left

    def run(self) -> None:
        try:
            turn = self.gate.acquire(self.on_wait, visitor=self.visitor, poll_seconds=POLL, kind=self.kind)
        except Superseded:
            self.outcome = "superseded"
            return
        except QueueFull:
            self.outcome = "full"
            return
        except Left:
            self.outcome = "left"
            return
        self.outcome = "running"
        nested = []
        release = True
        try:
            while True:
                command = self.commands.get()
                if command == "nest":
                    nested.append(self.gate.acquire())  # engine code's lm.lock inside the page's turn
                    self.depth += 1
                elif command == "unnest":
                    self.gate.release(nested.pop())
                    self.depth -= 1
                elif command == "die":
                    release = False  # the thread ends holding the gate (no finally ran)
                    self.outcome = "dead"
                    return
                elif command in ("finish", "fail"):
                    if command == "fail":
                        raise Left  # the visitor left during the run: the finally releases
                    return
                self.acked += 1
        except Left:
            pass
        finally:
            if release:
                for t in reversed(nested):
                    self.gate.release(t)
                self.gate.release(turn)
                self.outcome = "finished"

    def tell(self, command: str) -> None:
        before = self.acked
        self.commands.put(command)
        if command in ("nest", "unnest"):
            settle(lambda: self.acked > before, f"{self.name} did not {command}")


def settle(condition, what: str) -> None:
    deadline = time.monotonic() + SETTLE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not settled in {SETTLE} s: {what}")
        time.sleep(0.0005)


def nest_or_unnest(v: Visitor, unnest: bool) -> None:
    """A nested turn: one level out when asked and nested, else one level in (at most 3 deep)."""
    if unnest and v.depth:
        v.tell("unnest")
    elif v.depth < 3:
        v.tell("nest")


class GateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.gate = InferenceGate(max_queue=0, run_limit=RUN_LIMIT, stuck_after=STUCK_AFTER, clock=self.clock)
        self.queue: list[Visitor] = []  # the model: [0] holds the gate once it runs
        self.started: dict[int, float] = {}  # visitor name -> when its run started (model clock)
        self.stale: list[Visitor] = []  # holders the watchdog released; still running, off the queue
        self.runs: dict[str, list[float]] = {RUN: [], LOCK: []}  # the holds the gate should have recorded
        self.everyone: list[Visitor] = []
        self.count = 0
        self.removed_dead = 0
        self.released_stuck = 0

    def clock(self) -> float:
        return self.now

    @initialize(cap=st.sampled_from([0, 1, 2, 3]))
    def set_cap(self, cap: int) -> None:
        self.gate.max_queue = cap

    # -- the model's view -------------------------------------------------------------------

    def holder(self) -> Visitor | None:
        return self.queue[0] if self.queue and self.queue[0].outcome in ("running", "dead") else None

    def waiters(self) -> list[Visitor]:
        return [v for v in self.queue if v is not self.holder()]

    def promote(self) -> None:
        """The head of the model's queue starts (when it was waiting)."""
        if self.queue and self.queue[0].name not in self.started:
            self.started[self.queue[0].name] = self.now

    def drop_dead_head(self) -> None:
        """An ended holder's ticket goes at the next waiter's poll (or the watchdog's sweep)."""
        head = self.holder()
        if head is not None and head.outcome == "dead" and self.waiters():
            self.queue.pop(0)
            self.removed_dead += 1
            self.promote()

    def sync(self, what: str) -> None:
        """Wait for the gate and the threads to reach the model's state."""
        self.drop_dead_head()

        def settled() -> bool:
            with self.gate._cond:
                real = [t.thread for t in self.gate._queue]
                head = self.gate._queue[0] if self.gate._queue else None
                head_started = head is not None and head.started is not None
            want = [v.thread for v in self.queue]
            return (
                real == want
                and (not self.queue or head_started)
                and all(
                    v.outcome == ("running" if i == 0 else "waiting")
                    for i, v in enumerate(self.queue)
                    if v.outcome in ("running", "waiting")
                )
            )

        settle(settled, f"{what}: the gate's queue is not the model's")

    # -- rules --------------------------------------------------------------------------------

    @rule(
        visitor=st.one_of(st.none(), st.sampled_from(["a", "b", "c"])), kind=st.sampled_from([RUN, RUN, LOCK])
    )
    def join(self, visitor: str | None, kind: str):
        v = Visitor(self.count, visitor, self.gate, kind)
        self.count += 1
        self.everyone.append(v)
        head = self.holder()
        if head is not None and head.outcome == "dead":  # the new waiter's poll drops it
            self.queue.pop(0)
            self.removed_dead += 1
        old = next((w for w in self.waiters() if visitor is not None and w.visitor == visitor), None)
        cap = self.gate.max_queue
        if old is not None:
            self.queue[self.queue.index(old)] = v
        elif cap and len(self.waiters()) >= cap:
            v.outcome = "refused"
        else:
            self.queue.append(v)
        v.start()
        if v.outcome == "refused":
            settle(lambda: v.outcome == "full", "a join past the cap was not refused")
        if old is not None:
            settle(lambda: old.outcome == "superseded", "the older request was not superseded")
        self.promote()
        self.sync("join")

    @precondition(lambda self: len(self.waiters()) > 0)
    @rule(data=st.data())
    def leave_while_waiting(self, data):
        v = data.draw(st.sampled_from(self.waiters()))
        v.leave.set()
        self.queue.remove(v)
        settle(lambda: v.outcome == "left", "a visitor who left while waiting did not leave")
        self.promote()
        self.sync("leave while waiting")

    @precondition(lambda self: self.holder() is not None and self.holder().outcome == "running")
    @rule(how=st.sampled_from(["finish", "fail"]))
    def end_run(self, how: str):
        """The holder finishes, or leaves during its run (an exception through the finally)."""
        v = self.queue.pop(0)
        self.runs[v.kind].append(self.now - self.started[v.name])
        v.tell(how)
        settle(lambda: v.outcome == "finished", f"the holder did not {how}")
        self.promote()
        self.sync(how)

    @precondition(lambda self: self.holder() is not None and self.holder().outcome == "running")
    @rule(unnest=st.booleans())
    def nested_turn(self, unnest: bool):
        v = self.queue[0]
        nest_or_unnest(v, unnest)
        self.sync("nested turn")

    @precondition(lambda self: self.holder() is not None and self.holder().outcome == "running")
    @rule()
    def holder_thread_dies(self):
        v = self.queue[0]
        v.tell("die")
        settle(lambda: v.thread is not None and not v.thread.is_alive(), "the thread did not end")
        self.sync("a thread dying")

    @precondition(lambda self: self.stale)
    @rule(unnest=st.booleans())
    def released_holder_nested_turn(self, unnest: bool):
        """A holder the watchdog released is still inside its run: a nested turn (engine code's
        ``lm.lock``) is its own, at once, and queues nowhere."""
        v = self.stale[0]
        nest_or_unnest(v, unnest)
        self.sync("a released holder's nested turn")

    @precondition(lambda self: self.stale)
    @rule()
    def stale_holder_finishes(self):
        """A holder the watchdog released finishes at last: nothing in the queue changes."""
        v = self.stale.pop(0)
        v.tell("finish")
        settle(lambda: v.outcome == "finished", "the released holder did not finish")
        self.sync("a released holder finishing")

    @rule(seconds=st.sampled_from([0.0, 0.5, 3.0, 11.0, 60.0]))
    def time_passes(self, seconds: float):
        self.now += seconds

    @rule()
    def watchdog_sweep(self):
        head = self.holder()
        if head is not None and head.outcome == "dead":
            self.queue.pop(0)
            self.removed_dead += 1
        elif head is not None and self.now - self.started[head.name] > STUCK_AFTER:
            self.queue.pop(0)
            self.released_stuck += 1
            self.stale.append(head)
        status = self.gate.sweep()
        self.promote()
        self.sync("the watchdog's sweep")
        assert status.released_stuck == self.released_stuck

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def no_ticket_without_a_live_waiter(self):
        with self.gate._cond:
            tickets = list(self.gate._queue)
        for i, t in enumerate(tickets):
            alive = t.thread.is_alive()
            # an ended holder's ticket stays only while no one waits behind it (until a sweep)
            assert alive or (i == 0 and len(tickets) == 1), f"ticket {t.number} of an ended thread"

    @invariant()
    def one_pending_request_per_visitor(self):
        with self.gate._cond:
            pending = [t.visitor for t in self.gate._queue if t.started is None and t.visitor is not None]
        assert len(pending) == len(set(pending)), pending

    @invariant()
    def cap_never_exceeded(self):
        if self.gate.max_queue:
            assert self.gate.waiting <= self.gate.max_queue

    def typical(self, kind: str) -> float | None:
        recent = self.runs[kind][-RECENT_RUNS:]
        return statistics.median(recent) if recent else None

    @invariant()
    def estimate_follows_the_recorded_runs(self):
        """A ticket ahead counts its kind's median hold (a run's, or an engine lock's: kept
        apart); the holder what is left of it; a position past the queue, a run's."""
        status = self.gate.status()
        assert status.removed_dead == self.removed_dead
        run = self.typical(RUN)
        assert status.typical_run == (None if run is None else pytest.approx(run))
        for position in range(1, len(self.queue) + 2):
            got = self.gate.estimate(position)
            if run is None:
                assert got is None
                continue
            want = 0.0
            for i in range(position):
                v = self.queue[i] if i < len(self.queue) else None
                kind = RUN if v is None else v.kind
                hold = self.typical(kind) or (0.0 if kind == LOCK else run)
                if v is not None and v.name in self.started:
                    hold = max(hold - (self.now - self.started[v.name]), 0.0)
                want += hold
            assert got is not None and got >= 0.0
            assert got == pytest.approx(want)

    def teardown(self):
        for v in self.everyone:
            v.leave.set()
            v.commands.put("finish")
        for v in self.everyone:
            if v.thread is not None:
                v.thread.join(SETTLE)
                assert not v.thread.is_alive(), f"visitor {v.name} never ended"


GateMachine.TestCase.settings = examples(200, stateful_step_count=15)
test_gate_machine = GateMachine.TestCase


@pytest.mark.slow
def test_gate_machine_slow_profile():
    """The same machine with longer runs: 1,000 examples in ``make test``, 10,000 under
    ``ATTNVIZ_HYPOTHESIS_PROFILE=slow`` (property_settings)."""
    run_state_machine_as_test(GateMachine, settings=slow_settings(stateful_step_count=40))
