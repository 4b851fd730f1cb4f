"""The README's Docker commands, as the Docker tests read them (packaging/test_docker.py checks
that each one is run or checked; packaging/test_docker_image.py runs them)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_lines() -> list[str]:
    """Every command line in the README's "Docker" section, comments dropped."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Docker\n", 1)[1].split("\n## ", 1)[0]
    lines = [
        line.split(" #", 1)[0].strip()
        for block in re.findall(r"```bash\n(.*?)```", section, re.S)
        for line in block.splitlines()
    ]
    return [line for line in lines if line]


def readme_commands() -> list[list[str]]:
    """The same, as argv lists."""
    return [shlex.split(line) for line in readme_lines()]
