import threading
import time

import pytest

import attnviz
from attnviz.server.gate import InferenceGate
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


def until(condition, timeout: float = 10.0) -> None:
    """Wait for ``condition()`` to hold (polling a condition; the outcome never rides on a delay)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.001)


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

    t0 = threading.Thread(target=holder)
    t0.start()
    inside.wait(5)
    threads = []
    for i in (1, 2, 3):
        t = threading.Thread(target=waiter, args=(i,))
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
