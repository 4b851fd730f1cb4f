"""Soak: 50 different texts in sequence through the real server, measured from outside (psutil RSS
of the server process) and from inside (a test-only hook counts live AttentionResults).

Two ways of arriving: one visitor who opens 50 links in one tab (one session), and 50 visitors
who each open one share link (50 sessions, which Streamlit keeps for 2 minutes after they leave).
The UI's caches are bounded in entries and bytes (ui/models.py); the soak gives the result cache
a 32 MiB budget so that memory pinned outside the caches shows up.
"""

from __future__ import annotations

import random
import urllib.parse

import numpy as np
import pytest
from server import streamlit_server
from ws_client import figure_array, iter_session, run_session

pytestmark = pytest.mark.slow

N_TEXTS = 50
WARM = 5
RESULT_CACHE_MB = 32
RESULT_CACHE_ENTRIES = 16  # ui.models.RESULT_CACHE_ENTRIES
GROWTH_BOUND_MIB = 150  # RSS after 50 texts minus RSS after the first 5
CORPUS = (
    "the financial bank is located on river bank while a quick brown fox jumps over the lazy dog "
    "attention heads look at earlier tokens and the model predicts the next word from the context "
    "in spring the garden fills with music and the doctor walks by the window with a pencil"
)
REPORT: list[str] = []


def soak_queries(tag: str) -> list[str]:
    """50 different share-link queries, 8 to 64 words, reproducible; layer and head vary."""
    rng = random.Random(tag)
    words = CORPUS.split(" ")
    out = []
    for i in range(N_TEXTS):
        text = f"{tag} {i}: " + " ".join(rng.choice(words) for _ in range(rng.choice([8, 16, 32, 64])))
        out.append(urllib.parse.urlencode({"text": text, "layer": i % 30, "head": i % 9}))
    assert len(set(out)) == N_TEXTS
    return out


@pytest.fixture(scope="module")
def server():
    env = {"ATTNVIZ_RESULT_CACHE_MB": str(RESULT_CACHE_MB)}
    with streamlit_server(name="soak", env=env, diag=True) as s:
        run_session(s.url, "text=warm+up")  # load the model before measuring
        yield s


def check(run, i: int) -> None:
    assert run.status == "FINISHED_SUCCESSFULLY", run
    assert not run.exceptions, run.exceptions
    assert not [a for a in run.alerts if "went wrong" in a or "rror" in a], run.alerts
    heat = [t for f in run.figures for t in f["data"] if t.get("type") == "heatmap"]
    assert heat, f"text {i}: no heatmap"
    assert np.isfinite(figure_array(heat[-1]["z"]).astype(np.float64)).all()


def soak(server, runs, label: str) -> tuple[float, dict]:
    rss, seconds = [], []
    for i, run in enumerate(runs):
        check(run, i)
        rss.append(server.rss() / 2**20)
        seconds.append(run.seconds)
    held = server.diag()
    growth = rss[-1] - rss[WARM - 1]
    line = (
        f"{label}: RSS after {WARM} {rss[WARM - 1]:.0f} MiB, after {N_TEXTS} {rss[-1]:.0f} MiB, "
        f"growth {growth:.0f} MiB (bound {GROWTH_BOUND_MIB}); {held.get('results_alive')} results alive "
        f"(cache {held['results']['entries']} entries, {held['results']['mib']:.0f} MiB), "
        f"{held.get('sessions_kept')} sessions kept; {sum(seconds):.0f} s, slowest {max(seconds):.1f} s"
    )
    REPORT.append(line)
    print(line)
    assert server.alive()
    return growth, held


def test_one_visitor_fifty_texts(server):
    """One session opens 50 links in turn: memory stays within the bound and only the cached
    results (<= 16) plus the one on screen are alive."""
    growth, held = soak(server, iter_session(server.url, soak_queries("one")), "one session")
    assert growth <= GROWTH_BOUND_MIB, REPORT[-1]
    assert held["results_alive"] <= RESULT_CACHE_ENTRIES + 1, REPORT[-1]


def test_fifty_visitors_one_text_each(server):
    """50 sessions (share links opened by 50 people), one after another: memory stays within the
    bound, and live results stay within the cache's entries plus the sessions still connected."""
    runs = (run_session(server.url, q) for q in soak_queries("many"))
    growth, held = soak(server, runs, "50 sessions")
    assert held["results_alive"] <= RESULT_CACHE_ENTRIES + held["sessions_active"] + 1, REPORT[-1]
    assert growth <= GROWTH_BOUND_MIB, REPORT[-1]
