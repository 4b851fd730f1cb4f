"""The two test tiers: `make test-fast` (every change) and `make test` (everything, CI).

This module carries no marker, so the fast tier always selects it: `make test-fast` can never
end in pytest's exit 5 (no tests collected), whatever else the marker expression deselects.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXCLUDED = ("slow", "browser", "gpu")


def fast_expression() -> str:
    make = (ROOT / "Makefile").read_text()
    found = re.search(r"^FAST\s*:=\s*(.+)$", make, re.M)
    assert found, "Makefile: no FAST := marker expression"
    return found.group(1).strip()


def test_make_test_fast_runs_pytest_without_slow_browser_and_gpu():
    make = (ROOT / "Makefile").read_text()
    assert re.search(r'^test-fast: dev\n\t\$\(PY\) -m pytest -m "\$\(FAST\)"$', make, re.M), make
    assert "test-fast" in re.search(r"^\.PHONY:(.*)$", make, re.M).group(1).split()
    # make test runs everything: every test but the Docker ones in `pytest`, those in `test-docker`
    assert re.search(r'^pytest: dev\n\t\$\(PY\) -m pytest -m "not docker"$', make, re.M), make
    assert re.search(r"^test-docker: dev\n\tbash scripts/docker-test\.sh \$\(PY\)$", make, re.M), make
    assert "-m docker" in (ROOT / "scripts" / "docker-test.sh").read_text()
    assert {"pytest", "test-docker"} <= set(re.search(r"^test:(.*)$", make, re.M).group(1).split())
    words = fast_expression().split()
    for marker in EXCLUDED:
        assert f"not {marker}" in fast_expression()
    assert set(words) <= {"not", "and", *EXCLUDED}, "the fast tier only excludes; it selects nothing"


def test_markers_are_registered_and_strict():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    names = {m.split(":")[0] for m in cfg["markers"]}
    assert set(EXCLUDED) <= names
    assert "--strict-markers" in cfg["addopts"]  # a misspelt marker is an error, not a new tier


def test_browser_and_soak_tests_are_outside_the_fast_tier():
    """A module that starts Chromium is browser- or slow-marked as a whole, or marks each test
    that does; the soak test is slow."""
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        text = path.read_text()
        if path.name == "test_soak.py":
            assert re.search(r"^pytestmark = .*pytest\.mark\.slow", text, re.M), path.name
        if "chromium(" in text:
            module_mark = re.search(r"^pytestmark = .*pytest\.mark\.(slow|browser)", text, re.M)
            assert module_mark or "@pytest.mark.browser" in text, path.name
