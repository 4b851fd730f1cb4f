"""Environment flags parse one way (attnviz/envflags.py, re-exported by attnviz/server/env.py):
1/true/yes/on, 0/false/no/off in any case; anything else is a one-line error naming the flag,
never a silent "off"."""

from __future__ import annotations

import re
from pathlib import Path

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
    """Every ATTNVIZ_* variable, and HF_HUB_OFFLINE, goes through the one parser
    (attnviz.envflags, re-exported by attnviz.server.env): no other module of the package or the
    UI reads one of them from the environment by hand. Caught: load.hub_reachable comparing
    HF_HUB_OFFLINE with its own set of spellings; ATTNVIZ_CACHE, ALLOWED_MODELS, LOG_LEVEL (twice,
    with two defaults) and RAY_ADDRESS read by hand."""
    import re
    from pathlib import Path

    import attnviz
    from attnviz import envflags

    assert env.flag is envflags.flag and env.integer is envflags.integer  # one parser, re-exported
    assert env.BadSetting is envflags.BadSetting
    root = Path(attnviz.__file__).parent
    by_hand = re.compile(r"(environ\.get\(|getenv\(|environ\[)\s*[\"'](ATTNVIZ_|HF_HUB_OFFLINE)")
    offenders = [
        f"{p.relative_to(root)}:{i}"
        for p in [*root.rglob("*.py"), *(root.parent / "ui").rglob("*.py")]
        if p.name != "envflags.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if by_hand.search(line)
    ]
    assert not offenders, offenders


def test_loading_reads_its_flags_below_the_server():
    """attnviz.loading reads its flags from attnviz.envflags and imports nothing of attnviz.server
    (the server sits above loading). Caught: builtins / load importing attnviz.server.env."""
    import ast
    from pathlib import Path

    root = Path(loading.__file__).parent
    upward = []
    for p in root.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [f"{'.' * node.level}{node.module or ''}", *(a.name for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if any(n.startswith(("..server", "attnviz.server")) or n == "server" for n in names):
                upward.append(f"{p.name}:{node.lineno}")
    assert not upward, upward


@pytest.mark.parametrize(("raw", "offline"), [("1", True), (" On ", True), ("YES", True), ("false", None)])
def test_hub_offline_is_read_by_the_one_rule(monkeypatch, raw, offline):
    """HF_HUB_OFFLINE in any accepted spelling means no connection is tried; a typo is an error
    naming it, not a silent "online"."""
    import socket

    from attnviz.loading import load

    tried = []

    def refuse(*args, **kwargs):
        tried.append(args)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(load, "_reach", {})
    monkeypatch.setenv("HF_HUB_OFFLINE", raw)
    assert load.hub_reachable() is False
    assert bool(tried) is (offline is None)  # offline: the network is not touched
    monkeypatch.setenv("HF_HUB_OFFLINE", "ture")
    with pytest.raises(env.BadSetting, match="HF_HUB_OFFLINE='ture' is not a yes/no value"):
        load.hub_reachable()


@pytest.mark.parametrize(
    ("raw", "why"), [("abc", "not a whole number"), ("0", "out of range"), ("-5", "range")]
)
def test_integers_are_checked(monkeypatch, raw, why):
    monkeypatch.setenv("ATTNVIZ_MAX_TOKENS", raw)
    with pytest.raises(env.BadSetting, match=why):
        settings()


ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"ATTNVIZ_[A-Z][A-Z0-9_]*")
# set by a script for the server it starts, read by that script's own hook; or the test suite's
# own switch (read in tests/, named in the docs): not a setting of attnviz
SCRIPT_ONLY = {
    "ATTNVIZ_SOAK_DIAG": "scripts/demo_soak.py",
    "ATTNVIZ_HYPOTHESIS_PROFILE": "tests/properties/property_settings.py",
}


def test_every_attnviz_variable_is_in_the_one_table():
    """Every ATTNVIZ_* name the code, the scripts, the Docker files and the docs mention is a row
    of attnviz.server.env's table, and every row is mentioned somewhere (caught: ATTNVIZ_CACHE,
    RAY_ADDRESS, LOG_LEVEL, STATUS_FILE and ALLOWED_MODELS were read outside it; the Compose
    variables were in no table)."""
    files = [ROOT / "app.py", ROOT / "Dockerfile", ROOT / "Makefile", ROOT / "README.md"]
    files += [*ROOT.glob("compose*.yaml"), *(ROOT / "docs").glob("*.md"), *(ROOT / "scripts").glob("*")]
    for folder in ("attnviz", "ui", "pages"):
        files += (ROOT / folder).rglob("*.py")
    seen: dict[str, str] = {}
    for path in files:
        if path.is_file():
            for name in NAME.findall(path.read_text(errors="replace")):
                seen.setdefault(name, str(path.relative_to(ROOT)))
    assert {n: f for n, f in seen.items() if n not in env.FLAGS and n not in SCRIPT_ONLY} == {}
    assert set(env.FLAGS) - set(seen) == set()
    assert len(env.FLAGS) == len(set(env.FLAGS))  # one row per name across the three tables


def test_the_readme_and_the_settings_list_are_the_table():
    """The README's configuration table and settings.py's list name exactly the table's variables
    (caught: settings.py's list lacked FETCH_BUILTINS, RESULT_CACHE_MB, LOG_LEVEL and RAY_ADDRESS;
    the README lacked STATUS_FILE)."""
    from attnviz.server import settings as settings_module

    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    assert sorted(NAME.findall(" ".join(rows))) == sorted(env.FLAGS)
    listed = [line.split("=")[0] for line in (settings_module.__doc__ or "").splitlines()]
    assert sorted(n for n in listed if NAME.fullmatch(n)) == sorted(env.FLAGS)


def test_integers_read_by_the_app_and_the_cli_have_one_range(monkeypatch):
    """Startup's check and every reader use the table's range: a token cap the settings refuse
    no longer passes the startup check."""
    monkeypatch.setenv("ATTNVIZ_MAX_TOKENS", "2000000")
    for read in (env.check_all, settings):
        with pytest.raises(env.BadSetting, match=re.escape("out of range; use 1..1000000")):
            read()
    monkeypatch.setenv("ATTNVIZ_MAX_TOKENS", "1000000")
    env.check_all()
    assert settings().max_tokens == 1_000_000


@pytest.mark.parametrize(
    ("raw", "app", "cli"),
    [("", "INFO", "WARNING"), (" debug ", "DEBUG", "DEBUG"), ("loud", "INFO", "WARNING")],
)
def test_the_log_level_is_read_by_one_rule(monkeypatch, raw, app, cli):
    monkeypatch.setenv("ATTNVIZ_LOG_LEVEL", raw)
    assert (env.log_level("INFO"), env.log_level("WARNING")) == (app, cli)
