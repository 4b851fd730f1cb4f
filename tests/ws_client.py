"""Test helper: a headless Streamlit client - script runs over the server's websocket, no browser."""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from apptest import element_spec

from ui import heatmaps


@dataclass
class Run:
    """What one script run sent back: alerts (error/warning/info bodies), Plotly figures
    (parsed JSON), exceptions, the finish status and the wall time."""

    status: str
    alerts: list[str]
    figures: list[dict]
    exceptions: list[str]
    seconds: float
    widgets: list[dict]  # {"type", "label", "options" (selectbox), "password" (text_input)}


def run_session(url: str, query: str, *, timeout: float = 180) -> Run:
    """Open a fresh session on the server, run the main page with ``query`` (a URL query string,
    as a share link carries it) and collect the elements until the run finishes."""
    return next(iter_session(url, [query], timeout=timeout))


def iter_session(url: str, queries: list[str], *, timeout: float = 180) -> Iterator[Run]:
    """One session (one websocket) that opens each query string in turn, like one visitor pasting
    one link after another; yields a `Run` per query."""
    from streamlit.proto import BackMsg_pb2, ForwardMsg_pb2
    from websockets.sync.client import connect

    ws_url = url.replace("http://", "ws://") + "/_stcore/stream"
    with connect(ws_url, subprotocols=["streamlit"], open_timeout=30, max_size=2**28) as ws:
        for query in queries:
            back = BackMsg_pb2.BackMsg()
            back.rerun_script.query_string = query
            back.rerun_script.page_script_hash = ""
            alerts_, figures, exceptions, widgets = [], [], [], []
            t0 = time.monotonic()
            ws.send(back.SerializeToString())
            while True:
                msg = ForwardMsg_pb2.ForwardMsg()
                msg.ParseFromString(ws.recv(timeout=timeout))
                kind = msg.WhichOneof("type")
                if kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
                    el = msg.delta.new_element
                    which = el.WhichOneof("type")
                    if which == "alert":
                        alerts_.append(el.alert.body)
                    elif which == "plotly_chart":
                        figures.append(json.loads(el.plotly_chart.spec))
                    elif which == "bidi_component" and el.bidi_component.component_name == heatmaps.NAME:
                        data = json.loads(el.bidi_component.json)  # a heatmaps element (ui/heatmaps.py)
                        if "mark" not in data:
                            figures.append(element_spec({**heatmaps.figure(data), "key": data["id"]}))
                    elif which == "exception":
                        exceptions.append(f"{el.exception.type}: {el.exception.message}")
                    elif which in ("selectbox", "text_input", "text_area", "slider"):
                        w = getattr(el, which)
                        widgets.append(
                            {
                                "type": which,
                                "label": w.label,
                                "options": list(w.options) if which == "selectbox" else [],
                                "password": which == "text_input" and w.type == w.PASSWORD,
                            }
                        )
                elif kind == "script_finished":
                    status = ForwardMsg_pb2.ForwardMsg.ScriptFinishedStatus.Name(msg.script_finished)
                    if status != "FINISHED_EARLY_FOR_RERUN":
                        break
            yield Run(status, alerts_, figures, exceptions, time.monotonic() - t0, widgets)


def figure_array(value) -> np.ndarray:
    """A Plotly JSON array: a plain list, or a typed-array spec ``{"dtype", "bdata", "shape"}``."""
    if isinstance(value, dict) and "bdata" in value:
        arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        if shape:
            arr = arr.reshape([int(s) for s in str(shape).split(",")])
        return arr
    return np.asarray(value)


def send_back(url: str, fill, *, settle: float = 1.0) -> None:
    """Open a session and send one raw ``BackMsg`` that ``fill(msg)`` fills in (a message a
    hostile client could send: ``clear_cache``, ``set_run_on_save``...); read what comes back for
    ``settle`` seconds, then close."""
    from streamlit.proto import BackMsg_pb2
    from websockets.sync.client import connect

    ws_url = url.replace("http://", "ws://") + "/_stcore/stream"
    with connect(ws_url, subprotocols=["streamlit"], open_timeout=30, max_size=2**28) as ws:
        back = BackMsg_pb2.BackMsg()
        fill(back)
        ws.send(back.SerializeToString())
        deadline = time.monotonic() + settle
        with contextlib.suppress(TimeoutError):
            while time.monotonic() < deadline:
                ws.recv(timeout=max(deadline - time.monotonic(), 0.01))
