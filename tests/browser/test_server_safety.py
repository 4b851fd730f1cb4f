"""Safe defaults of the running server: XSRF and CORS on, tracebacks hidden, the public demo's
model list and no token field (a real `streamlit run app.py`)."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
from robustness_cases import VALID

import attnviz

ROOT = Path(__file__).resolve().parents[2]


def test_streamlit_config_keeps_xsrf_and_cors_and_hides_tracebacks():
    import tomllib

    cfg = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert cfg.get("server", {}).get("enableXsrfProtection", True) is True
    assert cfg.get("server", {}).get("enableCORS", True) is True
    assert cfg.get("client", {}).get("showErrorDetails") in ("none", "type"), "tracebacks would reach users"
    shown = subprocess.run(
        [sys.executable, "-m", "streamlit", "config", "show"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert not re.search(r"^enable(XsrfProtection|CORS) = false", shown, re.M)
    assert re.search(r'^showErrorDetails = "(none|type)"', shown, re.M)


@pytest.fixture(scope="module")
def demo_server():
    from server import streamlit_server

    with streamlit_server(name="robustness-demo", env={"ATTNVIZ_DEMO": "1"}) as s:
        yield s


@pytest.mark.slow
def test_running_server_has_xsrf_on_and_refuses_foreign_origins(demo_server):
    import urllib.request

    req = urllib.request.Request(
        demo_server.url + "/_stcore/health", headers={"Origin": "http://evil.example"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
        assert "_streamlit_xsrf=" in (r.headers.get("Set-Cookie") or ""), "XSRF protection is off"
        assert r.headers.get("Access-Control-Allow-Origin") in (None, ""), "CORS lets any origin in"
    preflight = urllib.request.Request(
        demo_server.url + "/_stcore/health",
        method="OPTIONS",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "GET"},
    )
    with urllib.request.urlopen(preflight, timeout=10) as r:
        assert r.headers.get("Access-Control-Allow-Origin") in (None, "")


@pytest.mark.slow
def test_demo_server_offers_only_allowed_models_and_no_token_field(demo_server):
    """A traversal link on the public demo: a warning, the allowed model instead, no free model
    field and no token field; then the server answers the next link."""
    from ws_client import run_session

    run = run_session(demo_server.url, urllib.parse.urlencode({"model": "../..", "text": VALID}))
    assert run.status == "FINISHED_SUCCESSFULLY" and not run.exceptions, run
    assert any("not offered on this server" in a for a in run.alerts), run.alerts
    pickers = [w for w in run.widgets if w["type"] == "selectbox" and w["label"] == "Model"]
    assert pickers and all(o.split(" ")[0] in attnviz.BUILTIN_MODELS for o in pickers[0]["options"]), pickers
    assert not [w for w in run.widgets if w["type"] == "text_input"], run.widgets  # no Hub id / path / token
    assert run.figures, "no chart for the allowed model"
    again = run_session(demo_server.url, urllib.parse.urlencode({"text": "the river bank"}))
    assert again.status == "FINISHED_SUCCESSFULLY" and again.figures and not again.exceptions


@pytest.mark.slow
def test_a_clear_cache_message_from_a_visitor_clears_nothing_on_the_demo(tmp_path):
    """An over-long link gets a message, not a silent default page (planted: no notice, fails).
    Streamlit's ``clear_cache`` (any client may send it) would wipe every visitor's models,
    results and the queue; a demo server drops it and logs it (ui/demo.py). Planted: without the
    guard the result cache is empty after the message."""
    from server import streamlit_server
    from ws_client import run_session, send_back

    with streamlit_server(name="demo-clear-cache", env={"ATTNVIZ_DEMO": "1"}, diag=True) as server:
        query = urllib.parse.urlencode({"text": VALID})
        run = run_session(server.url, query)
        assert run.status == "FINISHED_SUCCESSFULLY" and run.figures and not run.exceptions, run
        assert server.diag()["results"]["entries"] == 1
        send_back(server.url, lambda m: setattr(m, "clear_cache", True))
        send_back(server.url, lambda m: setattr(m, "set_run_on_save", True))
        diag = server.diag()
        assert diag["results"]["entries"] == 1, "a visitor's clear_cache wiped the shared caches"
        assert diag["gate"]["waiting"] == 0 and diag["gate"]["typical_run"] > 0  # the same queue
        log = server.log()
        assert "refused a 'clear_cache' message" in log and "refused a 'set_run_on_save' message" in log
        again = run_session(server.url, query)
        assert again.status == "FINISHED_SUCCESSFULLY" and again.figures and not again.exceptions
        for link in ("text=" + "a" * (512 * 1024), "&".join(f"p{i}=1" for i in range(1001))):
            run = run_session(server.url, link)  # Streamlit drops it: the page must say so
            assert any("This link is too long to open" in a for a in run.alerts), run.alerts
