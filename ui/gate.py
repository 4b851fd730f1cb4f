"""The demo's one queue as the pages see it: a turn with the position and an estimated wait
shown, one turn for a block of model work, waits that engine code starts shown too, and this
visitor's id (the queue's one-pending-request key). Outside demo mode a turn is free.

The rules of the queue itself (no leaked ticket, a cap, supersede, the watchdog) are the engine's:
`attnviz.server.gate`.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from attnviz.server.gate import InferenceGate, QueueFull, Superseded, UnnamedWait
from attnviz.server.queue_status import GateStatus
from attnviz.server.settings import settings
from ui import state

T = TypeVar("T")


def visitor() -> str:
    """This session's random id (the gate's one-pending-request key, the demo's result scope)."""
    return str(state.kept("visitor", secrets.token_hex(8)))


@st.cache_resource(show_spinner=False)
def shared() -> InferenceGate:
    """This process's one gate, its watchdog started with it."""
    cfg = settings()
    gate = InferenceGate(max_queue=cfg.queue_max, run_limit=cfg.run_limit)
    # stuck holders and left-over tickets become logged errors, not a jam; the status file (if
    # named) tells the container's health check that the queue moves
    gate.start_watchdog(status_file=Path(cfg.status_file) if cfg.status_file else None)
    gate.unnamed_waits = _page_wait
    return gate


def status() -> GateStatus:
    """The demo gate's queue length, oldest ticket and run times (for the operator)."""
    return shared().status()


POLL_SECONDS = 0.5  # a waiting page redraws its position this often (a visitor who left stops here)


def _no_check() -> None:
    return None


def wait_text(position: int, estimate: float | None) -> str:
    """The waiting visitor's line: position and, once runs have finished, an estimate."""
    ahead = "1 request is" if position == 1 else f"{position} requests are"
    about = "" if estimate is None else f" Estimated wait: about {max(round(estimate), 1)} s."
    return f"⏳ Busy: {ahead} ahead of yours.{about} It starts by itself."


def _page_wait() -> UnnamedWait | None:
    """How a wait that engine code starts (its ``lm.lock`` is the gate's) shows on the page that
    runs it: the position line where the page is, drawn at the first poll and cleared when the
    turn starts, and counted as this visitor's one request. None outside a page's run (a
    download's worker thread)."""
    if get_script_run_ctx() is None:
        return None
    gate = shared()
    slot: list[Any] = []

    def on_wait(position: int) -> None:
        if not slot:
            slot.append(st.empty())
        slot[0].info(wait_text(position, gate.estimate(position)))

    def done() -> None:
        if slot:
            slot[0].empty()

    return on_wait, done, visitor()


@contextlib.contextmanager
def turn() -> Iterator[Callable[[], None]]:
    """In demo mode, wait for the one-at-a-time gate (position and estimated wait shown, redrawn
    every `POLL_SECONDS`: each redraw is where Streamlit stops the run of a visitor who left,
    reloaded or edited, and the ticket goes with it), then hold it for the block. Yields
    ``check()``, which raises `RunTooLong` once the run is past the demo's limit (call it from
    progress callbacks). A full queue says so with a Retry button and stops the page. Reentrant:
    a turn inside a turn (Compare's two texts, a load inside a run) does not queue again."""
    if not settings().demo:
        yield _no_check
        return
    gate = shared()
    slot = st.empty()

    def on_wait(position: int) -> None:
        slot.info(wait_text(position, gate.estimate(position)))

    try:
        held = gate.acquire(on_wait, visitor=visitor(), poll_seconds=POLL_SECONDS)
    except QueueFull as err:
        slot.empty()
        st.warning(f"{err}.", icon=":material/hourglass_disabled:")
        st.button("Retry", key="attnviz_queue_retry", type="primary", icon=":material/refresh:")
        st.stop()
    except Superseded:
        st.stop()  # this visitor's newer request runs instead
    try:
        slot.empty()
        yield held.check
    finally:
        kept = getattr(_kept, "turns", None)
        if kept is not None:  # inside `one_turn`: held until its block ends
            kept.append(held)
        else:
            gate.release(held)


_kept = threading.local()


@contextlib.contextmanager
def one_turn() -> Iterator[None]:
    """Model work in the block shares one turn: the first run that needs the gate takes it and
    keeps it to the end of the block (Compare's second text never goes back to the end of the
    queue); a block whose results are all cached never queues."""
    if not settings().demo or getattr(_kept, "turns", None) is not None:
        yield
        return
    _kept.turns = []
    try:
        yield
    finally:
        turns, _kept.turns = _kept.turns, None
        for held in reversed(turns):
            shared().release(held)


def gated(run: Callable[[], T]) -> Callable[[], T]:
    """``run`` inside a `turn` (for a cached build that runs the model)."""

    def inside() -> T:
        with turn():
            return run()

    return inside


def checked(report: Callable[[int, int], None], check: Callable[[], None]) -> Callable[[int, int], None]:
    """A progress callback that first checks the turn's time limit (raising stops the run)."""

    def both(done: int, total: int) -> None:
        check()
        report(done, total)

    return both
