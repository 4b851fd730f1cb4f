"""Every bad CLI argument is one line on stderr and a non-zero exit, checked before a model loads;
a device that is not there is an error, never a silent fallback to another device and dtype."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tiny
import torch

import attnviz
from attnviz import cli, loading


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    """Arguments are checked at parse time: a load here means a bad argument got through."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(attnviz, "load_model", refuse)
    monkeypatch.setattr(loading, "load_model", refuse)


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def run_main(capsys, *argv: str) -> tuple[int, list[str]]:
    try:
        code = cli.main(list(argv))
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    err = capsys.readouterr().err
    return code, err.splitlines()


def assert_one_line(code: int, lines: list[str], message: str) -> None:
    assert code != 0
    assert len(lines) == 1, lines
    assert lines[0].startswith("attnviz: error: ") and message in lines[0], lines[0]


def unwritable_folder(tmp_path) -> str:
    """A folder no file can be created in, for this user (root ignores permission bits)."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o500)
        return str(folder)
    return "/sys"  # sysfs: not even root creates files in it


EXTRACT = ["extract", "--model", "smollm2-135m", "--text", "river bank"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["info", "--model", "smollm2-135m", "--device", "bogus"], "unknown device 'bogus'"),
        (["info", "--model", "smollm2-135m", "--device", "meta"], "unknown device 'meta'"),
        (["info", "--model", "smollm2-135m", "--device", "cuda"], "CUDA is not available"),
        (["bench", "--device", "cuda:1"], "CUDA is not available"),
        (["info", "--model", "smollm2-135m", "--dtype", "int3"], "unknown dtype 'int3'"),
        (["extract", "--model", "smollm2-135m", "--text", "  ", "--out", "x.npz"], "the text is empty"),
        (["bench", "--sizes", "abc"], "'abc' is not a whole number"),
        (["bench", "--sizes", "0"], "'0' must be 1 or more"),
        (["bench", "--sizes", "256,-4"], "'-4' must be 1 or more"),
        (["bench", "--sizes", ","], "comma-separated token counts"),
        (["bench", "--repeats", "0"], "must be 1 or more"),
        ([*EXTRACT, "--out", "x.npz", "--max-tokens", "0"], "must be 1 or more"),
        ([*EXTRACT, "--out", "x.npz", "--generate", "-1"], "must be 0 or more"),
        ([*EXTRACT, "--out", "x.npz", "--generate", "two"], "'two' is not a whole number"),
        ([*EXTRACT, "--out", "x.npz", "--verify", "abc"], "'abc' is not a layer; give a layer index"),
        ([*EXTRACT, "--out", "x.npz", "--verify", "-1"], "'-1' is not a layer"),
        (
            [*EXTRACT, "--out", "x.npz", "--verify", "99"],
            "layer 99 is out of range; smollm2-135m has layers 0..29",
        ),
        ([*EXTRACT, "--out", "x.npz", "--format", "tiny"], "invalid choice: 'tiny'"),
        (["extract", "--model", "a b!!", "--text", "t", "--out", "x.npz"], "this name also has ' ' '!'"),
        (["info", "--model", "a b!!"], "a Hub id has only letters"),
        (["info", "--model", "/no/such/folder"], "local folder '/no/such/folder' does not exist"),
        (["info", "--model", "two\nlines"], "control characters"),
        (["app", "--port", "70000"], "not a port"),
        (["app", "--port", "http"], "not a whole number"),
    ],
)
def test_bad_argument_is_one_line_and_non_zero(capsys, no_cuda, argv, message):
    code, lines = run_main(capsys, *argv)
    assert code == 2
    assert_one_line(code, lines, message)


def test_verify_layer_checked_against_the_config_before_loading(capsys, tmp_path):
    """A local model's layer count comes from its config.json alone (the weights never load)."""
    folder = tmp_path / "tiny-llama"
    tiny.model("llama-gqa").config.save_pretrained(folder)  # 3 layers, no weights in the folder
    argv = ["extract", "--model", str(folder), "--text", "river bank", "--out", str(tmp_path / "x.npz")]
    code, lines = run_main(capsys, *argv, "--verify", "3")
    assert code == 2
    assert_one_line(code, lines, "layer 3 is out of range; " + str(folder) + " has layers 0..2")
    with pytest.raises(AssertionError, match="a model was loaded"):  # layer 2 exists: it gets to the load
        cli.main([*argv, "--verify", "2"])


def test_builtin_layer_counts_match_their_descriptions():
    assert set(cli.BUILTIN_LAYERS) == set(attnviz.BUILTIN_MODELS)
    for spec, n in cli.BUILTIN_LAYERS.items():
        assert f"{n} layers" in attnviz.BUILTIN_MODELS[spec]


def test_max_tokens_default_from_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_MAX_TOKENS", "many")
    code, lines = run_main(capsys, *EXTRACT, "--out", "x.npz")
    assert code == 2
    assert_one_line(code, lines, "ATTNVIZ_MAX_TOKENS='many' is not a whole number")
    monkeypatch.setenv("ATTNVIZ_MAX_TOKENS", "77")
    parser = cli._parser()
    args = parser.parse_args([*EXTRACT, "--out", "x.npz"])
    cli._preflight(args, parser.error)
    assert args.max_tokens == 77
    args = parser.parse_args([*EXTRACT, "--out", "x.npz", "--max-tokens", "9"])  # the flag wins
    cli._preflight(args, parser.error)
    assert args.max_tokens == 9


def test_extract_out_under_a_file(capsys, tmp_path):
    blocker = tmp_path / "a-file.txt"
    blocker.write_text("not a folder")
    code, lines = run_main(capsys, *EXTRACT, "--out", str(blocker / "sub" / "x.npz"))
    assert_one_line(code, lines, "is not a folder")


def test_extract_out_into_unwritable_folder(capsys, tmp_path):
    folder = unwritable_folder(tmp_path)
    code, lines = run_main(capsys, *EXTRACT, "--out", os.path.join(folder, "x.npz"))
    assert_one_line(code, lines, f"cannot write '{os.path.join(folder, 'x.npz')}'")


def test_extract_out_is_a_folder(capsys, tmp_path):
    code, lines = run_main(capsys, *EXTRACT, "--out", str(tmp_path))
    assert_one_line(code, lines, "is a folder")


def test_good_arguments_parse_to_values(tmp_path):
    """The same checks let good values through, normalised."""
    args = cli._parser().parse_args(["bench", "--sizes", " 256, 1024 ", "--repeats", "2", "--device", "cpu"])
    assert (args.sizes, args.repeats, args.device) == ("256,1024", 2, "cpu")
    out = tmp_path / "new" / "deeper" / "x.npz"  # folders that do not exist yet are fine
    args = cli._parser().parse_args([*EXTRACT, "--out", str(out), "--generate", "0"])
    assert args.out == out and args.generate == 0 and not out.parent.exists()
    assert cli._parser().parse_args(["app", "--port", "8600"]).port == 8600


def test_named_device_that_is_missing_is_an_error_not_a_fallback(monkeypatch, no_cuda):
    with pytest.raises(attnviz.AttnvizError, match="CUDA is not available"):
        loading.resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert loading.resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(attnviz.AttnvizError, match="has 1 CUDA device"):
        loading.resolve_device("cuda:3")
    assert loading.resolve_device("cpu") == torch.device("cpu")


def test_auto_device_without_accelerators_is_cpu(monkeypatch, no_cuda):
    mps = getattr(torch.backends, "mps", None)
    if mps is not None:
        monkeypatch.setattr(mps, "is_available", lambda: False)
    assert loading.resolve_device("auto") == torch.device("cpu")


@pytest.mark.slow  # two interpreters importing torch and transformers
def test_console_entry_point_runs_the_same_checks():
    """`python -m attnviz` (the `attnviz` script calls the same main) in a real process."""
    proc = subprocess.run(
        [sys.executable, "-m", "attnviz", "bench", "--sizes", "abc"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "attnviz: error: argument --sizes: 'abc' is not a whole number; give comma-separated token counts"
    ]
    version = subprocess.run(
        [sys.executable, "-m", "attnviz", "--version"], capture_output=True, text=True, timeout=120
    )
    assert version.returncode == 0 and version.stdout.strip() == f"attnviz {attnviz.__version__}"


def test_app_runs_streamlit_on_the_shipped_script_with_its_config(monkeypatch, capsys):
    from attnviz.server import app_files

    seen: dict = {}

    def fake_exec(path, cmd):  # `attnviz app` becomes the server: exec, not a child process
        seen["path"], seen["cmd"] = path, cmd

    monkeypatch.setattr(cli.os, "execv", fake_exec)
    code, lines = run_main(capsys, "app", "--port", "8600", "--address", "0.0.0.0")
    assert code == 0 and lines == [f"attnviz: serving {app_files.app_script()} on http://0.0.0.0:8600"]
    cmd = seen["cmd"]
    assert seen["path"] == sys.executable
    assert cmd[:4] == [sys.executable, "-m", "streamlit", "run"] and cmd[4] == str(app_files.app_script())
    assert Path(cmd[4]).name == "app.py" and (Path(cmd[4]).parent / "pages").is_dir()
    flags = cmd[5:]
    # the shipped .streamlit/config.toml, as flags (Streamlit would not read it from the package)
    config = tomllib.loads((Path(cmd[4]).parent / ".streamlit" / "config.toml").read_text())
    expected = {
        f"--{section}.{key}={str(value).lower() if isinstance(value, bool) else value}"
        for section, options in config.items()
        for key, value in options.items()
    }
    assert expected and expected <= set(flags), expected - set(flags)
    assert flags[-4:] == [
        "--server.port=8600",
        "--server.address=0.0.0.0",
        "--server.headless=true",
        "--global.developmentMode=false",
    ]


def test_app_without_streamlit_says_which_extra(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "streamlit" else real(name, *a)
    )
    code, lines = run_main(capsys, "app")
    assert code == 1 and lines == [
        'attnviz: error: the web app needs Streamlit: pip install "streamlit>=1.45,<2" '
        '(in a checkout: pip install ".[app]")'
    ]


def test_app_removes_a_previous_servers_queue_status(monkeypatch, capsys, tmp_path):
    """A status file left by a previous server (a restarted container keeps /tmp) would read as a
    stuck queue until a visitor came: `attnviz app` removes it before it becomes the server."""
    status = tmp_path / "queue.json"
    status.write_text('{"updated": 0}')
    monkeypatch.setenv("ATTNVIZ_STATUS_FILE", str(status))
    monkeypatch.setattr(cli.os, "execv", lambda path, cmd: None)
    code, _ = run_main(capsys, "app")
    assert code == 0 and not status.exists()
    code, _ = run_main(capsys, "app")  # none there: nothing to remove, no error
    assert code == 0
