"""tests/README.md's table, module → its tests, cannot drift: every source module of attnviz/ has
exactly one row, and every test file a row names exists. (No marker: the fast tier runs it.)"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def table() -> dict[str, list[str]]:
    """{module path: [test file paths under tests/]} from the README's rows."""
    rows: dict[str, list[str]] = {}
    for line in (TESTS / "README.md").read_text().splitlines():
        if line.startswith("| `attnviz/"):
            _, module, tests, _ = line.split("|")
            name = module.strip().strip("`")
            assert name not in rows, f"two rows for {name}"
            named = [t for t in re.findall(r"`([^`]+\.py)`", tests) if t.count("/") == 1]
            assert named or "none yet" in tests, (
                f"{name}: a row names no test file and does not say 'none yet'"
            )
            rows[name] = named
    return rows


def test_every_module_has_a_row_and_every_row_a_module():
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "attnviz").rglob("*.py")}
    rows = set(table())
    assert sorted(modules - rows) == [], "modules without a row in tests/README.md"
    assert sorted(rows - modules) == [], "rows in tests/README.md for modules that are gone"


def test_every_named_test_file_exists():
    missing = [f"{m}: {t}" for m, tests in table().items() for t in tests if not (TESTS / t).is_file()]
    assert missing == []
