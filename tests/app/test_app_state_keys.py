"""Every session-state key of the app is named in ui/state.py (issue 40): pages and ui modules
read and write session-only values through `state.recall` / `remember` / `kept` / `forget`, never
a raw ``st.session_state[...]`` of their own (16 such keys lived in seven files)."""

from __future__ import annotations

import re
from pathlib import Path

from ui import state

ROOT = Path(__file__).resolve().parents[2]
RAW = re.compile(r"session_state(\[|\.get\(|\.setdefault\(|\.pop\(|\.update\()")


def test_no_module_but_ui_state_keeps_its_own_session_key():
    files = sorted([*ROOT.glob("ui/**/*.py"), *ROOT.glob("pages/*.py"), ROOT / "app.py"])
    raw = [
        f"{f.relative_to(ROOT)}:{i}: {line.strip()}"
        for f in files
        if f.name != "state.py" or f.parent.name != "ui"
        for i, line in enumerate(f.read_text().splitlines(), 1)
        if RAW.search(line.split("#")[0]) and "``" not in line  # code, not comments or docs
    ]
    assert not raw, "\n".join(raw)


def test_every_session_key_is_named_once():
    keys = list(state.SESSION_KEYS.values())
    assert len(keys) == len(set(keys))
    assert not set(keys) & set().union(*(cls.names() for cls in _params()))  # not a link parameter


def _params():
    from ui import params

    return [c for c in vars(params).values() if isinstance(c, type) and issubclass(c, params.Params)]
