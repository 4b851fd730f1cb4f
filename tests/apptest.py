"""Running a page of the app in Streamlit's AppTest and reading what it draws (the helpers every
tests/app module uses). The tiny random models of tests/tiny.py are served as ``tiny:<arch>``
(tests/conftest.py registers them with the engine)."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import numpy as np
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

import attnviz

ROOT = Path(__file__).resolve().parents[1]
TINY = "tiny:llama-gqa"


def _scan_once() -> None:
    """Every new AppTest scans all installed distributions for Streamlit component manifests
    (0.15 s here; the fast tier makes ~600 AppTests): the installed packages do not change during
    a test run, so the scan's answer is kept after the first one (a copy each time)."""
    from streamlit.components.v2 import manifest_scanner

    scan = manifest_scanner.scan_component_manifests
    if getattr(scan, "kept_by_attnviz_tests", False):
        return
    kept: list = []

    def scan_kept(max_workers: int | None = None) -> list:
        if not kept:
            kept.append(scan(max_workers))
        return list(kept[0])

    scan_kept.kept_by_attnviz_tests = True  # type: ignore[attr-defined]
    manifest_scanner.scan_component_manifests = scan_kept


_scan_once()
TEXT = "the bank of the river"
TIMEOUT = 120


def prepare(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No demo mode, no server token, empty process caches (conftest serves the tiny models)."""
    for name in ("ATTNVIZ_DEMO", "ATTNVIZ_ALLOWED_MODELS", "ATTNVIZ_MAX_TOKENS", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    st.cache_resource.clear()
    return monkeypatch


def new_app(page: str = "app.py", **params: object) -> AppTest:
    """A fresh browser session opening a share link to ``page`` (not yet run)."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    for name, value in params.items():
        at.query_params[name] = str(value)
    if page != "app.py":
        at.switch_page(page)
    return at


def specs(at: AppTest) -> list[dict]:
    """Every chart on the page: each Plotly chart's spec, then each heatmaps element
    (`ui.heatmaps`) as a spec of the same shape (`element_spec`), in page order."""
    from ui import heatmaps

    out = []
    for e in _tree(at._tree, []):
        proto = getattr(e, "proto", None)
        if getattr(e, "type", "") == "plotly_chart":
            out.append(json.loads(proto.spec))
        elif getattr(proto, "component_name", "") == heatmaps.NAME and '"mark"' not in proto.json[:40]:
            data = json.loads(proto.json)
            if "mark" not in data:
                out.append(element_spec({**heatmaps.figure(data), "key": data["id"]}))
    return out


def _tree(node, found: list) -> list:
    for child in getattr(node, "children", {}).values():
        found.append(child)
        _tree(child, found)
    return found


def elements(at: AppTest, *, marks: bool = False) -> list[dict]:
    """The heatmaps elements drawn (`ui.heatmaps.figure` of each one's data, with its "key"), in
    page order; ``marks``: the frame moves (`ui.heatmaps.mark`: {"mark", "index"}) instead."""
    from ui import heatmaps

    out = []
    for e in _tree(at._tree, []):
        proto = getattr(e, "proto", None)
        if getattr(proto, "component_name", "") != heatmaps.NAME or not proto.json:
            continue
        data = json.loads(proto.json)
        if ("mark" in data) == marks:
            out.append(data if marks else {**heatmaps.figure(data), "key": data["id"]})
    return out


def payload_bytes(at: AppTest) -> int:
    """Bytes of chart data the page sends: Plotly specs and heatmaps elements' data."""
    from ui import heatmaps

    return sum(len(e.proto.spec) for e in at.get("plotly_chart")) + sum(
        len(e.proto.json)
        for e in _tree(at._tree, [])
        if getattr(e.proto, "component_name", "") == heatmaps.NAME
    )


def element_spec(fig: dict) -> dict:
    """A heatmaps element's figure in a Plotly spec's shape: its title (the first panel's when it
    has none), panel titles as annotations, the colour bar as the colour axis, one heatmap per
    panel (z as drawn, x the key labels, y the query labels, the hover's value name)."""
    import plotly.graph_objects as go

    bar = fig["bar"]
    title = fig["title"] or fig["panels"][0]["title"]
    stops = [list(stop) for stop in go.layout.Coloraxis(colorscale=bar["colorscale"]).colorscale]  # as Plotly
    axis = {"cmin": bar["cmin"], "cmax": bar["cmax"], "colorscale": stops,
            "colorbar": {"title": {"text": bar["title"]}}}  # fmt: skip
    # the element sets text as text (never HTML); a Plotly spec holds it escaped: so do these
    esc = lambda t: html.escape(str(t), quote=False)  # noqa: E731
    data = [
        {"type": "heatmap", "name": esc(p["title"]), "z": p["z"], "x": [esc(t) for t in p["k"]],
         "y": [esc(t) for t in p["q"]], "hovertemplate": bar["hover"]} for p in fig["panels"]
    ]  # fmt: skip
    annotations = [{"text": esc(p["title"])} for p in fig["panels"]] if len(fig["panels"]) > 1 else []
    layout = {"title": {"text": esc(title)}, "coloraxis": axis, "annotations": annotations}
    return {"data": data, "layout": layout, "element": fig}


def heatmaps(spec: dict) -> list[dict]:
    return [t for t in spec["data"] if t.get("type") == "heatmap"]


def titled(at: AppTest, text: str) -> dict:
    """The one-trace chart whose title contains ``text``."""
    found = [s for s in specs(at) if text in (s["layout"].get("title") or {}).get("text", "") + " "]
    assert found, [(s["layout"].get("title") or {}).get("text") for s in specs(at)]
    return found[0]


def z_of(trace: dict) -> np.ndarray:
    z = trace["z"]
    if isinstance(z, dict):  # plotly's base64 typed array
        shape = tuple(int(s) for s in z["shape"].split(","))
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.dtype(z["dtype"])).reshape(shape)
    return np.asarray(z, dtype=float)


def ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def open_clicked_head(at: AppTest, chart: str, button: str, layer: int, head: int) -> str:
    """Click the (layer, head) cell of the layers × heads map ``chart`` (its selection as Plotly
    reports it: the cell's customdata), then the ``button`` the page offers for it: the Explorer's
    link opens at that head. Returns the button's label (it names the head)."""
    at.session_state[chart] = {"selection": {"points": [{"customdata": [layer, head]}], "point_indices": [0]}}
    at.run()
    ok(at)
    label = at.button(key=button).label
    assert f"layer {layer}, head {head}" in label, label
    at.button(key=button).click().run()
    ok(at)
    assert at.query_params["layer"] == str(layer) and at.query_params["head"] == str(head)
    return label


def engine(text: str, arch: str = "llama-gqa") -> attnviz.AttentionResult:
    """What the engine gives for ``text`` on the tiny model (the numbers a page must draw)."""
    import tiny

    return attnviz.extract(tiny.loaded(arch), text)


def labels(text: str, arch: str = "llama-gqa") -> list[str]:
    import tiny

    res = attnviz.extract(tiny.loaded(arch), text)
    return [html.escape(s, quote=False) for s in res.tokens.labels]


def vals(v) -> np.ndarray:
    """A 1-D figure array as numbers (Plotly writes numpy arrays as base64 without a shape)."""
    if isinstance(v, dict):
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
    return np.asarray(v, dtype=float)


def mounted(at: AppTest, component: str) -> list[dict]:
    """The mount data (``data=``) of every `st.components.v2` element named ``component`` that the
    last run drew, in page order."""
    found: list = []

    def walk(node: object) -> None:
        for child in getattr(node, "children", {}).values():
            proto = getattr(child, "proto", None)
            if proto is not None and getattr(proto, "component_name", "") == component:
                found.append(json.loads(proto.json))
            walk(child)

    walk(at._tree)
    return found


def share_link(at: AppTest) -> str:
    """The share box's link (`ui.share_link`: plain text with a Copy button, not a code block)."""
    links = mounted(at, "attnviz_share_link")
    assert links, "no share link on the page"
    return links[-1]["url"]
