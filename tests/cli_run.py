"""The command line run in the test process: exit code, stdout and stderr of `attnviz ARGS`."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

from attnviz import cli


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str) -> Ran:
    """`python -m attnviz ARGS` in this process (the same `main`; a real process is spawned once,
    in test_cli_args.py): exit code, stdout and stderr. An uncaught exception propagates."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(args))
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    return Ran(code, out.getvalue(), err.getvalue())
