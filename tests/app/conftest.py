"""Shared fixtures of the page tests (app.py and pages/ in Streamlit's AppTest, in process, on the
tiny models that tests/conftest.py serves as ``tiny:<arch>``)."""

from __future__ import annotations

import pytest
from apptest import prepare


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No demo mode, no server token, empty process caches: each page test starts clean."""
    return prepare(monkeypatch)
