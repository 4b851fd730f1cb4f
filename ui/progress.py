"""A long extraction shows its stages and can be cancelled.

`attnviz.extract(..., progress=...)` reports each attention layer of the forward pass as it
finishes. Every report redraws a progress bar (stage, elapsed time, an estimate of what is left);
drawing hands control to Streamlit for a moment, so a click on Cancel (or on any other widget)
stops the forward pass right there and frees its work instead of waiting for the whole pass. A
cancelled run stays cancelled until the person runs it again or changes the text.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Hashable, Iterator

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from attnviz.extract import auto_check_skipped
from ui import state

# The bar is redrawn at most this often: each redraw is a message the browser renders (a React
# update and the bar's slide, ~0.05 s of Chromium's CPU) while the forward runs beside it on the
# same cores (a redraw per layer: +0.3 s of a 1,500-token extraction, +4 s of an 8,192-token one).
# The first and the last report are always drawn; a Cancel click lands at the next redraw.
REDRAW_EVERY = 1.0


def _key(run_key: Hashable) -> str:
    return hashlib.sha256(repr(run_key).encode()).hexdigest()[:16]


def _cancel(key: str) -> None:
    state.remember("cancelled", key)


def _clear() -> None:
    state.forget("cancelled")


def cancelled(run_key: Hashable) -> bool:
    """True when this run was cancelled; says so, with a button that runs it again."""
    key = _key(run_key)
    if state.recall("cancelled") != key:
        return False
    st.info("Cancelled: nothing was kept. Run it again, or change the text.", icon=":material/cancel:")
    st.button("Run again", key=f"rerun_{key}", on_click=_clear)
    return True


def stage_text(what: str, done: int, total: int, elapsed: float, skipped: str = "") -> str:
    """The bar's line: the stage, the time so far and, once a layer is done, the time left; at
    the end, the check against eager, or why it is skipped (``skipped``)."""
    if done >= total:
        if skipped:
            return f"{what}: forward pass done · drawing ({skipped}; the page offers it per layer)"
        return f"{what}: forward pass done · checking one layer of each stack against eager and drawing"
    line = f"{what}: forward pass, attention layer {done} of {total} · {elapsed:.0f} s"
    if done:
        line += f", about {elapsed / done * (total - done):.0f} s left"
    return line


@contextlib.contextmanager
def staged(what: str, n_tokens: int, run_key: Hashable) -> Iterator[Callable[[int, int], None]]:
    """A progress bar and a Cancel button for one run; yields the ``progress`` callback."""
    skipped = auto_check_skipped(n_tokens)
    with _bar(
        run_key,
        f"{what}: {n_tokens} tokens, starting the forward pass…",
        "Stop this run now; nothing is kept and the model is free for the next request.",
        lambda done, total, elapsed: stage_text(what, done, total, elapsed, skipped),
    ) as report:
        yield report  # an interrupted run leaves the bar to the rerun, which redraws the page


@contextlib.contextmanager
def _cleared_on_error(holder: DeltaGenerator) -> Iterator[None]:
    """An error inside (a refused text, out of memory) clears the bar and its Cancel button, so
    the error is not shown under a "Running…" that never ends. Streamlit's own rerun/stop
    signals are not errors (BaseException): the rerun redraws the page."""
    try:
        yield
    except Exception:
        holder.empty()
        raise


@contextlib.contextmanager
def steps(
    what: str, run_key: Hashable, *, unit: str = "step", keeps: bool = True
) -> Iterator[Callable[[int, int], None]]:
    """A progress bar with a Cancel button for work done in steps (pooling every layer, the
    Explain page's trace); yields ``report(done, total)``. Check `cancelled` with the same
    ``run_key`` before starting. ``keeps``: whether a cancelled run keeps what it did."""
    with _bar(
        run_key,
        f"{what}…",
        "Stop now; what is done so far is kept for the next try." if keeps else "Stop now; nothing is kept.",
        lambda done, total, _: f"{what}: {unit} {done} of {total}…",
    ) as report:
        yield report


@contextlib.contextmanager
def _bar(
    run_key: Hashable, first: str, cancel_help: str, line: Callable[[int, int, float], str]
) -> Iterator[Callable[[int, int], None]]:
    """A bar showing ``first``, a Cancel button beside it, and ``report(done, total)`` that
    redraws the bar with ``line(done, total, elapsed)`` at most every `REDRAW_EVERY` seconds
    (always the first and the last report); both are cleared when the work ends or fails."""
    key = _key(run_key)
    holder = st.empty()
    with holder.container():
        bar = st.progress(0.0, text=first)
        st.button("Cancel", key=f"cancel_{key}", on_click=_cancel, args=(key,), help=cancel_help)
    started = drawn = time.perf_counter()

    def report(done: int, total: int) -> None:
        nonlocal drawn
        now = time.perf_counter()
        if 0 < done < total and now - drawn < REDRAW_EVERY:
            return
        drawn = now
        bar.progress(min(done / max(total, 1), 1.0), text=line(done, total, now - started))

    with _cleared_on_error(holder):
        yield report
    holder.empty()
