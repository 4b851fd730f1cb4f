"""Clicks on figures drawn with ``on_select="rerun"``: each new click read once, and a clicked
chart drawn under a new key so that clicking the same point again is a new click."""

from __future__ import annotations

from typing import Any

from ui import state


def clicked(event: Any, key: str) -> list | None:
    """The customdata of a new click on a chart drawn with ``on_select="rerun"`` (None when the
    selection is the one already handled, so a later widget change is not overridden)."""
    try:  # PlotlyState supports both attribute and item access; a plain dict only items
        points = list(event["selection"]["points"]) if event else []
    except (KeyError, TypeError):
        points = []
    data = next((p.get("customdata") for p in points if p.get("customdata") is not None), None)
    seen = state.kept("seen_clicks", {})
    mark = repr(data)
    if data is None or seen.get(key) == mark:
        if data is None:
            seen.pop(key, None)
        return None
    seen[key] = mark
    return list(data) if isinstance(data, list | tuple) else [data]


def chart_key(name: str) -> str:
    """The widget key of clickable chart ``name`` in this run (see `click`)."""
    return f"{name}_{state.recall('click_rounds', {}).get(name, 0)}"


def click(name: str) -> list | None:
    """A new click on chart ``name`` (drawn with ``key=chart_key(name)``), read before the chart
    is drawn in this run: its customdata, or None.

    After a click the chart is drawn under a new key: Plotly keeps a clicked point selected and
    a second click on it unselects it, so an event would say nothing about clicking a tile
    clicked before (head 1, head 4, head 1 again stayed on 4). A new chart starts with nothing
    selected, so every click is a new point."""
    key = chart_key(name)
    picked = clicked(state.widget_value(key), key)
    if picked:
        rounds = state.kept("click_rounds", {})
        rounds[name] = rounds.get(name, 0) + 1
        state.recall("seen_clicks", {}).pop(key, None)
    return picked
