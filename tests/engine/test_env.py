"""Server environment flags parse one way (attnviz/env.py): 1/true/yes/on, 0/false/no/off in any
case; anything else is a one-line error naming the flag, never a silent "off"."""

from __future__ import annotations

import pytest

from attnviz import loading
from attnviz.server import env
from attnviz.server.settings import settings

BOOLEAN_FLAGS = tuple(env.BOOLEAN_FLAGS)


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "Yes", " on ", "oN"])
def test_true_spellings(monkeypatch, raw):
    monkeypatch.setenv("X_FLAG", raw)
    assert env.flag("X_FLAG") is True


@pytest.mark.parametrize("raw", ["0", "false", "False", "NO", "off", ""])
def test_false_spellings(monkeypatch, raw):
    monkeypatch.setenv("X_FLAG", raw)
    assert env.flag("X_FLAG", default=False) is False
    assert env.flag("X_UNSET_FLAG", default=True) is True


@pytest.mark.parametrize("raw", ["ture", "2", "enabled", "y e s"])
def test_anything_else_is_an_error_naming_the_flag(monkeypatch, raw):
    monkeypatch.setenv("X_FLAG", raw)
    with pytest.raises(env.BadSetting) as err:
        env.flag("X_FLAG")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"X_FLAG={raw.strip()!r} is not a yes/no value")


def test_every_boolean_flag_is_read_through_the_one_parser(monkeypatch):
    """ATTNVIZ_ALLOW_PICKLE=true used to be ignored (only "1" counted)."""
    monkeypatch.setenv("ATTNVIZ_TRUST_REMOTE_CODE", "True")
    assert loading.trust_remote_code() is True
    monkeypatch.setenv("ATTNVIZ_TRUST_REMOTE_CODE", "maybe")
    with pytest.raises(env.BadSetting, match="ATTNVIZ_TRUST_REMOTE_CODE"):
        loading.trust_remote_code()
    monkeypatch.setenv("ATTNVIZ_DEMO", "ON")
    monkeypatch.delenv("ATTNVIZ_MAX_TOKENS", raising=False)
    assert settings().demo is True
    assert "ATTNVIZ_FETCH_BUILTINS" in BOOLEAN_FLAGS
    for name in BOOLEAN_FLAGS:
        monkeypatch.setenv(name, "ture")
        with pytest.raises(env.BadSetting, match=name):
            env.check_all()
        monkeypatch.setenv(name, "0")


def test_no_flag_is_read_by_hand():
    """Every ATTNVIZ_* yes/no or number goes through attnviz.server.env: no other module of the package
    compares an ATTNVIZ_ variable with "1" or a set of spellings."""
    import re
    from pathlib import Path

    root = Path(env.__file__).parent
    by_hand = re.compile(r"environ\.get\(\s*[\"']ATTNVIZ_(?!CACHE|ALLOWED_MODELS|LOG_LEVEL)")
    offenders = [
        f"{p.relative_to(root)}:{i}"
        for p in root.rglob("*.py")
        if p.name != "env.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if by_hand.search(line)
    ]
    assert not offenders, offenders


@pytest.mark.parametrize(
    ("raw", "why"), [("abc", "not a whole number"), ("0", "out of range"), ("-5", "range")]
)
def test_integers_are_checked(monkeypatch, raw, why):
    monkeypatch.setenv("ATTNVIZ_MAX_TOKENS", raw)
    with pytest.raises(env.BadSetting, match=why):
        settings()
