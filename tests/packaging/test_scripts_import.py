"""Every name a script in scripts/ imports from attnviz exists. The scripts run outside the test
suite (benchmarks, the soak, screenshots), so a name moved in the engine would break them
silently (caught: bench_explain.py and bench_qk.py importing forward_kwargs from
attnviz.explain.residual after the front door moved it to attnviz.loading.forward)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _missing(path: Path) -> list[str]:
    missing = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("attnviz"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        missing.append(f"{path.name}: {node.module}.{alias.name}")
    return missing


def test_every_attnviz_name_a_script_imports_exists():
    scripts = sorted(SCRIPTS.glob("*.py"))
    assert scripts
    assert [m for p in scripts for m in _missing(p)] == []
