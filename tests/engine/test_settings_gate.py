import contextlib
import logging
import random
import threading
import time

import pytest
from gate_helpers import hold, until

import attnviz
from attnviz.server.gate import InferenceGate, QueueFull, RunTooLong, Superseded
from attnviz.server.settings import DEMO_MAX_TOKENS, settings
from attnviz.server.specs import resolve


def test_default_settings_allow_everything(monkeypatch):
    monkeypatch.delenv("ATTNVIZ_DEMO", raising=False)
    monkeypatch.delenv("ATTNVIZ_MAX_TOKENS", raising=False)
    s = settings()
    assert not s.demo and s.allow_local_paths and s.allow_token_field
    assert s.model_choices[:2] == ("smollm2-135m", "minilm-l6")
    resolve("some/other-model", s)  # no exception


def test_demo_mode_restricts(monkeypatch):
    monkeypatch.setenv("ATTNVIZ_DEMO", "1")
    monkeypatch.delenv("ATTNVIZ_ALLOWED_MODELS", raising=False)
    monkeypatch.delenv("ATTNVIZ_MAX_TOKENS", raising=False)
    s = settings()
    assert s.demo and not s.allow_local_paths and not s.allow_token_field
    assert s.max_tokens == DEMO_MAX_TOKENS
    assert s.allowed_models == tuple(attnviz.BUILTIN_MODELS)
    for bad in ["gpt2", "../..", "/etc", "~", "file:///etc/passwd"]:
        with pytest.raises(attnviz.NotAllowed, match="public demo"):
            resolve(bad, s)
    resolve("smollm2-135m", s)


def test_demo_allow_list_and_cap_from_env(monkeypatch):
    monkeypatch.setenv("ATTNVIZ_DEMO", "yes")
    monkeypatch.setenv("ATTNVIZ_ALLOWED_MODELS", "smollm2-135m, gpt2")
    monkeypatch.setenv("ATTNVIZ_MAX_TOKENS", "nonsense")
    with pytest.raises(attnviz.AttnvizError, match="ATTNVIZ_MAX_TOKENS='nonsense' is not a whole number"):
        settings()  # a bad setting stops the server with its name (attnviz.server.env)
    monkeypatch.setenv("ATTNVIZ_MAX_TOKENS", "")
    s = settings()
    assert s.allowed_models == ("smollm2-135m", "gpt2")
    assert s.max_tokens == DEMO_MAX_TOKENS
    resolve("gpt2", s)


def test_gate_is_fifo_and_reports_positions():
    gate = InferenceGate()
    order: list[int] = []
    seen: dict[int, list[int]] = {}
    inside = threading.Event()
    release = threading.Event()

    def holder():
        with gate.turn():
            inside.set()
            release.wait(5)
            order.append(0)

    def waiter(i):
        seen[i] = []
        with gate.turn(on_wait=seen[i].append, poll_seconds=0.01):
            order.append(i)

    t0 = threading.Thread(daemon=True, target=holder)
    t0.start()
    inside.wait(5)
    threads = []
    for i in (1, 2, 3):
        t = threading.Thread(daemon=True, target=waiter, args=(i,))
        t.start()
        threads.append(t)
        until(lambda i=i: gate.waiting == i)  # waiter i is queued before waiter i + 1 starts
    assert gate.waiting == 3
    release.set()
    for t in [t0, *threads]:
        t.join(5)
    assert order == [0, 1, 2, 3]
    assert seen[1][0] == 1 and seen[3][0] == 3
    assert seen[3] == sorted(seen[3], reverse=True)  # positions only move forward
    assert gate.waiting == 0


class Left(BaseException):
    """What Streamlit raises at a yield point for a visitor who has gone (StopException is a
    BaseException too)."""


def drained(gate: InferenceGate) -> bool:
    """Empty: nothing waits, nothing runs, and a new turn gets in at once."""
    st = gate.status()
    if st.waiting or st.running_for is not None:
        return False
    got = threading.Event()

    def probe():
        with gate.turn():
            got.set()

    t = threading.Thread(daemon=True, target=probe)
    t.start()
    t.join(2)
    return got.is_set()


@pytest.mark.parametrize("stop_at", [1, 2, 3])
def test_a_visitor_who_leaves_while_waiting_leaves_no_ticket(stop_at):
    """on_wait raising (the page's position message for a visitor who has gone) at any poll
    removes the ticket: the queue moves on (issue 34: the ticket stayed and jammed the queue)."""
    gate = InferenceGate()
    holder, release = hold(gate, 10)
    calls: list[int] = []

    def on_wait(pos: int) -> None:
        calls.append(pos)
        if len(calls) == stop_at:
            raise Left

    with pytest.raises(Left), gate.turn(on_wait=on_wait, poll_seconds=0.001):
        pytest.fail("a visitor who left must never run")
    assert gate.waiting == 0  # dropped at once, while the holder still runs
    release.set()
    holder.join(5)
    assert drained(gate)


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_a_session_stopped_during_its_run_releases_the_gate(where):
    gate = InferenceGate()
    steps = {"start": 0, "middle": 1, "end": 2}[where]
    with pytest.raises(Left), gate.turn() as turn:
        for i in range(3):
            if i == steps:
                raise Left
            turn.check()
    assert drained(gate)


def test_a_waiter_behind_a_visitor_who_left_moves_up():
    gate = InferenceGate()
    holder, release = hold(gate, 10)
    second_pos: list[int] = []
    left = threading.Event()

    def leaver():
        def on_wait(pos):
            if second_pos:  # the next visitor has queued behind us: leave now
                left.set()
                raise Left

        with contextlib.suppress(Left), gate.turn(on_wait=on_wait, poll_seconds=0.001):
            pass

    def stayer():
        with gate.turn(on_wait=second_pos.append, poll_seconds=0.001):
            pass

    a = threading.Thread(daemon=True, target=leaver)
    a.start()
    until(lambda: gate.waiting == 1)
    b = threading.Thread(daemon=True, target=stayer)
    b.start()
    until(lambda: left.is_set())
    until(lambda: 1 in second_pos[1:])  # position 2 -> 1 while the holder still runs
    assert second_pos[0] == 2
    release.set()
    for t in (holder, a, b):
        t.join(5)
    assert drained(gate)


def test_fifty_visitors_coming_and_going_always_drain():
    """50 visitors at random: leave while waiting, fail or stop during the run, edit (a second
    request from the same visitor), or finish. At no point may two run at once, and the gate
    ends empty."""
    rng = random.Random(34)
    gate = InferenceGate(max_queue=0)
    running = [0]
    overlap: list[int] = []
    ran = [0]
    guard = threading.Lock()

    def visitor(i: int, plan: str, polls: int, visitor_id: int):
        def on_wait(_pos: int) -> None:
            nonlocal polls
            polls -= 1
            if plan == "leave" and polls <= 0:
                raise Left

        stopped = contextlib.suppress(Left, Superseded, RuntimeError)
        with stopped, gate.turn(on_wait=on_wait, visitor=visitor_id, poll_seconds=0.001):
            with guard:
                running[0] += 1
                if running[0] > 1:
                    overlap.append(i)
            try:
                time.sleep(rng.random() * 0.004)
                if plan == "fail":
                    raise RuntimeError("boom")
                if plan == "stop":
                    raise Left
                ran[0] += 1
            finally:
                with guard:
                    running[0] -= 1

    threads = []
    for i in range(50):
        plan = rng.choice(["leave", "fail", "stop", "finish", "finish"])
        t = threading.Thread(
            daemon=True, target=visitor, args=(i, plan, rng.randint(1, 4), rng.randint(0, 30))
        )
        threads.append(t)
        t.start()
        time.sleep(rng.random() * 0.002)
    deadline = time.monotonic() + 10
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0))
    assert not any(t.is_alive() for t in threads)
    assert not overlap
    assert ran[0] > 0
    assert drained(gate)


def test_queue_cap_refuses_with_a_message():
    gate = InferenceGate(max_queue=1)
    holder, release = hold(gate, 10)
    queued = threading.Event()

    def wait_one():
        with gate.turn(on_wait=lambda pos: queued.set(), poll_seconds=0.001):
            pass

    waiter = threading.Thread(daemon=True, target=wait_one)
    waiter.start()
    assert queued.wait(5)
    with pytest.raises(QueueFull, match="queue is full"), gate.turn():
        pass
    assert gate.waiting == 1  # the refused one never queued
    release.set()
    holder.join(5)
    waiter.join(5)
    assert drained(gate)


def test_one_pending_request_per_visitor_keeps_its_place():
    gate = InferenceGate()
    holder, release = hold(gate, 10)
    outcome: dict[str, str] = {}
    queued = {k: threading.Event() for k in ("old", "other", "new")}

    def request(name: str, visitor: str):
        try:
            with gate.turn(on_wait=lambda pos: queued[name].set(), visitor=visitor, poll_seconds=0.001):
                outcome[name] = f"ran {len(outcome)}"
        except Superseded:
            outcome[name] = "superseded"

    old = threading.Thread(daemon=True, target=request, args=("old", "v1"))
    old.start()
    assert queued["old"].wait(5)
    other = threading.Thread(daemon=True, target=request, args=("other", "v2"))
    other.start()
    assert queued["other"].wait(5)
    new = threading.Thread(daemon=True, target=request, args=("new", "v1"))  # v1 edits its text
    new.start()
    until(lambda: outcome.get("old") == "superseded")
    assert gate.waiting == 2  # v1's new request and v2's
    release.set()
    for t in (holder, old, other, new):
        t.join(5)
    assert outcome == {"old": "superseded", "new": "ran 1", "other": "ran 2"}  # new took old's place
    assert drained(gate)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_time_limit_per_run_and_the_estimate():
    clock = Clock()
    gate = InferenceGate(run_limit=10, clock=clock)
    assert gate.estimate(1) is None  # no run yet: no estimate
    for spent in (2.0, 4.0, 6.0):
        with gate.turn():
            clock.now += spent
    assert gate.status().typical_run == 4.0
    assert gate.estimate(1) == 4.0 and gate.estimate(3) == 12.0
    with gate.turn() as turn:
        clock.now += 9
        turn.check()  # within the limit
        assert gate.estimate(2) == 4.0  # the holder is past typical: next starts "now" + one run
        clock.now += 2
        with pytest.raises(RunTooLong, match="limit of 10 s"):
            turn.check()
    assert drained(gate)


def test_watchdog_releases_a_stuck_holder_with_a_logged_error(caplog):
    clock = Clock()
    gate = InferenceGate(run_limit=10, stuck_after=50, clock=clock)
    holder, release = hold(gate, 10)
    clock.now += 40
    assert gate.sweep().running_for == 40  # slow, not stuck
    clock.now += 20
    with caplog.at_level(logging.ERROR, logger="attnviz.server.gate"):
        st = gate.sweep()
    assert "held the gate for 60 s" in caplog.text
    assert st.running_for is None and st.released_stuck == 1
    assert drained(gate)  # the next visitor runs although the stuck one never returned
    release.set()
    holder.join(5)
    assert drained(gate)  # its late exit removes nothing of anyone else's


def test_a_ticket_left_by_an_ended_thread_is_removed(caplog):
    """The net under the finally: a thread that took a turn and ended without releasing it (a
    bug) does not jam the gate: the next waiter's poll removes it, with an error logged."""
    gate = InferenceGate()
    t = threading.Thread(daemon=True, target=gate.acquire)
    t.start()
    t.join(5)
    assert gate.status().running_for is not None
    ok = threading.Event()

    def next_visitor():
        with gate.turn(poll_seconds=0.001):
            ok.set()

    with caplog.at_level(logging.ERROR, logger="attnviz.server.gate"):
        threading.Thread(daemon=True, target=next_visitor).start()
        assert ok.wait(5)
    assert "ended thread" in caplog.text
    assert gate.status().removed_dead == 1
    assert drained(gate)


def test_status_line_shows_queue_length_and_oldest_ticket():
    clock = Clock()
    gate = InferenceGate(max_queue=8, clock=clock)
    holder, release = hold(gate, 10)
    queued = threading.Event()
    w = threading.Thread(
        daemon=True, target=lambda: gate.turn(on_wait=lambda p: queued.set(), poll_seconds=0.001).__enter__()
    )
    w.start()
    assert queued.wait(5)
    clock.now += 7
    line = gate.status().line()
    assert "1 waiting (cap 8)" in line and "oldest ticket 7.0 s" in line and "running for 7.0 s" in line
    release.set()
    holder.join(5)
    w.join(5)  # entered and never left, then ended: the net removes it
    assert drained(gate)


def test_gated_lock_queues_engine_code_at_the_gate_and_is_reentrant():
    gate = InferenceGate()
    lock = gate.lock(threading.RLock())
    with gate.turn(), lock, lock:  # the page's turn, then the engine's lm.lock: no second ticket
        assert gate.waiting == 0
    holder, release = hold(gate, 10)
    entered = threading.Event()

    def engine():
        with lock:
            entered.set()

    t = threading.Thread(daemon=True, target=engine)
    t.start()
    until(lambda: gate.waiting == 1)  # engine code waits at the gate, not beside it
    assert not entered.is_set()
    release.set()
    holder.join(5)
    t.join(5)
    assert entered.is_set() and drained(gate)


def test_engine_waits_show_their_position_and_count_per_visitor():
    """A wait that engine code starts (a `GatedLock`, no ``on_wait`` of its own) asks the gate's
    ``unnamed_waits`` (set by the app): its position is shown at every poll, cleared once when
    the turn starts, and it is the visitor's one pending request (a newer one takes its place).
    A thread for which ``unnamed_waits`` says None (no page) waits unseen."""
    gate = InferenceGate()
    lock = gate.lock(threading.RLock())
    seen: dict[str, list] = {"a": [], "b": []}
    who = threading.local()

    def unnamed():
        name = getattr(who, "name", None)
        if name is None:
            return None
        return (lambda pos: seen[name].append(pos)), (lambda: seen[name].append("done")), "visitor-1"

    gate.unnamed_waits = unnamed
    holder, release = hold(gate, 10)
    outcome: dict[str, str] = {}

    def engine(name):
        who.name = name
        try:
            with lock:
                outcome[name] = "ran"
        except Superseded:
            outcome[name] = "superseded"

    first = threading.Thread(daemon=True, target=engine, args=("a",))
    first.start()
    until(lambda: 1 in seen["a"])  # the position, shown while it waits
    second = threading.Thread(daemon=True, target=engine, args=("b",))
    second.start()  # the same visitor again: takes the first one's place
    first.join(5)
    assert outcome["a"] == "superseded"
    until(lambda: 1 in seen["b"])
    unseen = threading.Thread(daemon=True, target=engine, args=(None,))
    unseen.start()
    until(lambda: gate.waiting == 2)
    release.set()
    holder.join(5)
    second.join(5)
    unseen.join(5)
    assert outcome["b"] == "ran" and outcome[None] == "ran"
    assert seen["b"][-1] == "done" and seen["b"].count("done") == 1
    assert set(seen["b"][:-1]) == {1}
    assert drained(gate)


def test_queue_settings_from_env(monkeypatch):
    from attnviz.server import env
    from attnviz.server.settings import DEMO_QUEUE_MAX, DEMO_RUN_LIMIT_S

    monkeypatch.delenv("ATTNVIZ_QUEUE_MAX", raising=False)
    monkeypatch.delenv("ATTNVIZ_RUN_LIMIT_S", raising=False)
    monkeypatch.delenv("ATTNVIZ_DEMO", raising=False)
    s = settings()
    assert s.queue_max == 0 and s.run_limit is None  # no queue limits off the demo
    monkeypatch.setenv("ATTNVIZ_DEMO", "1")
    s = settings()
    assert (s.queue_max, s.run_limit) == (DEMO_QUEUE_MAX, DEMO_RUN_LIMIT_S)
    monkeypatch.setenv("ATTNVIZ_QUEUE_MAX", "0")  # 0 = no cap, accepted at startup too
    monkeypatch.setenv("ATTNVIZ_RUN_LIMIT_S", "30")
    env.check_all()
    assert (settings().queue_max, settings().run_limit) == (0, 30.0)
    monkeypatch.setenv("ATTNVIZ_RUN_LIMIT_S", "0")
    with pytest.raises(env.BadSetting, match="ATTNVIZ_RUN_LIMIT_S=0 is out of range"):
        env.check_all()


def test_the_watchdog_writes_the_queue_status_for_the_health_check(tmp_path):
    """With a status file, the watchdog writes the gate's status at start and at every pass (the
    health check's evidence that the queue moves): the queue length and the oldest ticket."""
    import json

    from attnviz.server.healthcheck import read_status, verdict

    path = tmp_path / "queue.json"
    gate = InferenceGate(max_queue=4, run_limit=60)
    holder, release = hold(gate, 10)
    leave = threading.Event()

    def wait_then_run() -> None:
        with gate.turn():
            leave.wait(10)

    waiter = threading.Thread(daemon=True, target=wait_then_run)
    waiter.start()
    until(lambda: gate.waiting == 1)
    gate.start_watchdog(interval=0.01, status_file=path)
    until(lambda: path.exists() and json.loads(path.read_text())["waiting"] == 1)
    data = read_status(path)
    assert data["running_for"] is not None and data["oldest_wait"] >= 0 and data["stuck_after"] == 150
    ok, line = verdict(data, data["updated"] + 1)
    assert ok and "1 waiting (cap 4)" in line
    ok, line = verdict(data, data["updated"] + 31)  # 6 passes of 0.01 s, at least 30 s
    assert not ok and "has not reported for 31 s" in line
    release.set()  # the waiter runs: a later pass says so
    holder.join(5)
    until(lambda: (d := json.loads(path.read_text()))["waiting"] == 0 and d["running_for"] is not None)
    leave.set()
    waiter.join(5)
    until(lambda: json.loads(path.read_text())["running_for"] is None)
