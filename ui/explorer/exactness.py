"""Exactness as a signal for what is on screen: the layer drawn, checked against transformers'
own eager attention on the same layer input (`attnviz.verify.self_check`), or why it was
not checked, with a button that checks it now."""

from __future__ import annotations

import streamlit as st

from attnviz import AttentionResult, Check
from attnviz.exact.eager import CannotCheck
from attnviz.extract import auto_check_skipped
from attnviz.layout import Stack
from attnviz.verify import self_check
from ui import models, state
from ui.text import guarded


def _where(res: AttentionResult, stack: str, layer: int) -> str:
    label = res.layout.layer_label(layer).capitalize()
    return label if stack == "self" else f"{label} ({stack})"


def line(check: Check, where: str) -> str:
    """The one line of a check, e.g. "Layer 3 equals eager ...: max |Δ| 3e-08 (float32, tolerance 1e-05)"."""
    if check.against == "eager itself":
        return f":green-badge[:material/verified: exact] {where}: eager's own probabilities ({check.dtype})."
    return (
        f":green-badge[:material/verified: exact] {where} equals transformers' eager attention on the same "
        f"input: max |Δ| {check.max_abs_diff:.0e} ({check.dtype}, tolerance {check.tolerance:.0e})."
    )


def draw(ref: models.ResultRef, res: AttentionResult, stack: Stack, layer: int) -> None:
    """The exactness line of ``layer`` of ``stack``: the check that ran (the extraction's, or one
    asked for here), else why none ran and a button that runs it on this layer."""
    where = _where(res, stack, layer)
    done = next((c for c in res.checks if c.stack == stack and c.layer == layer), None)
    asked = state.kept("checks_asked", set())
    ask = (ref.key, stack, layer)
    if done is None and ask in asked:
        lm = models.load(ref.spec, ref.token)
        if lm is None:
            return
        with guarded("checking the layer against eager"):
            try:
                done = models.cached("check", ask, lambda: self_check(lm.model, res, {stack: layer})[0])
            except CannotCheck as err:
                st.markdown(f":orange-badge[not checked] {where}: {err}.")
                return
    if done is not None:
        st.markdown(line(done, where))
        return
    if res.checks:
        other = ", ".join(
            f"{_where(res, c.stack, c.layer).lower()} (max |Δ| {c.max_abs_diff:.0e})" for c in res.checks
        )
        why = f"the extraction checked {other}"
    else:
        why = auto_check_skipped(res.n_tokens) or "no check ran with this extraction"
    # the button under the line, as wide as its label: in a quarter column it read "Check la…"
    st.markdown(f":orange-badge[not checked] {where} was not compared with eager here: {why}.")
    st.button(
        f"Check {where.lower()}",
        key=f"check_{stack}_{layer}",
        on_click=asked.add,
        args=(ask,),
        help="Recompute this layer with transformers' own eager attention on the same input and compare.",
    )
