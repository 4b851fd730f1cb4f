"""The image built, started and used as a user would (`make test-docker`; README "Docker").

The README's Docker commands are the ones run here, changed only where a test must: the image
tag, the host port, the volume name, and `--network attnviz-test` (a bridge network of the tests'
own: ports are published on it and it has no route out, so the containers are offline). The
build is the README's offline one (a Debian base from scripts/docker-base.sh, the torch wheel
from pip's find-links folder in wheels/): this machine reaches no image registry and no torch
index. Figures (build time, image size, first view, docker stop) are printed at the end and
written to test-output/docker/figures.json. test_docker.py reads the Dockerfile and checks
that every README Docker command is run here or checked there.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from browser_page import alerts, charts, chromium, wait_idle
from docker_readme import readme_commands
from server import OUTPUT, free_port
from ws_client import run_session

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[2]
OUT = OUTPUT / "docker"
NETWORK = "attnviz-test"
TAG = "attnviz-test"
RUN_ID = f"{os.getpid()}"
TEXT = "The cat sat on the mat because it was warm."
VALUE_OPTIONS = {"-p", "-v", "-e", "--gpus", "--name", "--network", "-t", "--build-arg", "-f"}


def docker(*args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        out = f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        raise AssertionError(f"docker {shlex.join(args)} exited {proc.returncode}\n{out}")
    return proc


# -- the README's commands -------------------------------------------------------------------------
def readme(pattern: str) -> list[str]:
    """The one README command whose text matches ``pattern``."""
    found = [c for c in readme_commands() if re.search(pattern, shlex.join(c))]
    assert len(found) == 1, f"README: {len(found)} Docker commands match {pattern!r}: {found}"
    return found[0]


def image_index(argv: list[str]) -> int:
    """Where the image name stands in a `docker run` argv (the first word that is no option)."""
    i = argv.index("run") + 1
    while argv[i].startswith("-"):
        i += 2 if argv[i] in VALUE_OPTIONS else 1
    return i


def as_run(
    argv: list[str], *, image: str, port: int | None, volume: str, network: str = NETWORK
) -> list[str]:
    """A README `docker run` with the test's image, port, volume and network (nothing else)."""
    out = list(argv)
    out[image_index(out)] = image
    out = [f"{port}:8501" if a == "8501:8501" and port else a for a in out]
    out = [f"{volume}:/data" if a == "attnviz-data:/data" else a for a in out]
    at = out.index("run") + 1
    return [*out[:at], "--network", network, *out[at:]][1:]  # without the leading "docker"


# -- engine, base, image ----------------------------------------------------------------------------
@pytest.fixture(scope="session")
def figures(request) -> Iterator[dict]:
    found: dict = {}
    yield found
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "figures.json").write_text(json.dumps(found, indent=1) + "\n")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        sys.stdout.write("\n" + "".join(f"docker figure: {k} = {v}\n" for k, v in found.items()))


@pytest.fixture(scope="session")
def engine() -> str:
    proc = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        pytest.fail(
            "no Docker engine answers (docker info): run `make test-docker`, which installs docker.io "
            "and starts dockerd as root",
            pytrace=False,
        )
    if docker("network", "inspect", NETWORK, check=False).returncode != 0:
        docker("network", "create", "--driver", "bridge", NETWORK)
    return proc.stdout.strip()


def torch_wheel() -> Path:
    """A torch 2.13.0 wheel for Python 3.11 in wheels/ (hard-linked from pip's find-links folder)."""
    wheels = ROOT / "wheels"
    pattern = "torch-2.13.0*-cp311-cp311-*manylinux*x86_64.whl"
    have = sorted(wheels.glob(pattern))
    if have:
        return have[0]
    config = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
    ).stdout
    folders = re.findall(r"find-links='?([^'\n]+)'?", config) + os.environ.get("PIP_FIND_LINKS", "").split()
    for folder in folders:
        for wheel in sorted(Path(folder).glob(pattern)):
            wheels.mkdir(exist_ok=True)
            target = wheels / wheel.name
            try:
                os.link(wheel, target)
            except OSError:
                shutil.copyfile(wheel, target)
            return target
    pytest.fail(f"no {pattern} in wheels/ or in pip's find-links folders {folders}", pytrace=False)


def build(argv: list[str], log: Path, *, context: Path = ROOT) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=context, capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - t0
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(proc.stdout + proc.stderr)
    return proc, seconds


def as_build(argv: list[str], tag: str) -> list[str]:
    out = list(argv)
    out[out.index("-t") + 1] = tag
    return out


@pytest.fixture(scope="session")
def image(engine, figures) -> str:
    base = readme(r"^scripts/docker-base\.sh ")
    t0 = time.monotonic()
    made = subprocess.run(["bash", *base], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert made.returncode == 0, made.stdout + made.stderr
    figures["base"] = f"{made.stdout.strip().splitlines()[-1]} ({time.monotonic() - t0:.0f} s here)"
    figures["torch wheel"] = torch_wheel().name
    argv = as_build(readme(r"^docker build .*TORCH=wheel"), TAG)
    proc, seconds = build(argv, OUT / "build.log")
    assert proc.returncode == 0, f"{shlex.join(argv)}\n{(proc.stdout + proc.stderr)[-6000:]}"
    size = int(docker("image", "inspect", "--format", "{{.Size}}", TAG).stdout)
    figures["build"] = (
        f"{seconds:.0f} s ({shlex.join(argv)}; {proc.stdout.count('Using cache')} steps cached)"
    )
    figures["image size"] = f"{size / 1e9:.2f} GB"
    return TAG


@dataclass
class Box:
    name: str
    url: str
    volume: str
    started: float  # time.monotonic() at `docker run`
    serving: float = 0.0  # seconds from `docker run` to the health endpoint answering

    def exec(self, *cmd: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        return docker("exec", self.name, *cmd, timeout=timeout, check=check)

    def logs(self) -> str:
        proc = docker("logs", self.name, check=False)
        return proc.stdout + proc.stderr

    def cpu_seconds(self) -> float:
        """CPU time the container has used so far (its cgroup's cpuacct), seconds."""
        return int(self.exec("cat", "/sys/fs/cgroup/cpuacct/cpuacct.usage").stdout) / 1e9

    def health(self) -> str:
        return docker("inspect", "--format", "{{.State.Health.Status}}", self.name).stdout.strip()


def wait_serving(box: Box, timeout: float = 180) -> float:
    """Seconds from `docker run` until Streamlit's health endpoint answers on the published port."""
    t0 = box.started
    while True:
        state = docker("inspect", "--format", "{{.State.Status}}", box.name).stdout.strip()
        assert state == "running", f"{box.name} is {state}:\n{box.logs()[-3000:]}"
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(box.url + "/_stcore/health", timeout=2) as r,
        ):
            if r.status == 200:
                return time.monotonic() - t0
        assert time.monotonic() - t0 < timeout, (
            f"{box.name} not serving after {timeout} s:\n{box.logs()[-3000:]}"
        )
        time.sleep(0.25)


@contextlib.contextmanager
def container(argv: list[str], name: str, *, port: int, volume: str, serve: bool = True) -> Iterator[Box]:
    """``docker run -d --name NAME`` of a README command (as `as_run` made it); removed on exit."""
    docker("rm", "-f", name, check=False)
    at = argv.index("run") + 1
    t0 = time.monotonic()
    docker(*argv[:at], "-d", "--name", name, *argv[at:])
    box = Box(name, f"http://127.0.0.1:{port}", volume, t0)
    try:
        if serve:
            box.serving = wait_serving(box)
        yield box
    finally:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{name}.log").write_text(box.logs())
        docker("rm", "-f", "-v", name, check=False)


@pytest.fixture(scope="module")
def volume(engine) -> Iterator[str]:
    name = f"attnviz-test-data-{RUN_ID}"
    yield name
    docker("volume", "rm", "-f", name, check=False)


@pytest.fixture(scope="module")
def app(image, volume, figures) -> Iterator[Box]:
    """The README's `docker run -p 8501:8501 -v attnviz-data:/data attnviz`."""
    port = free_port()
    argv = as_run(
        readme(r"^docker run -p 8501:8501 -v attnviz-data:/data attnviz$"),
        image=image,
        port=port,
        volume=volume,
    )
    with container(argv, f"attnviz-test-app-{RUN_ID}", port=port, volume=volume) as box:
        yield box


# -- the checks -------------------------------------------------------------------------------------
def wait_healthy(box: Box, timeout: float = 180) -> float:
    """Seconds from `docker run` until Docker reports the HEALTHCHECK healthy."""
    while (status := box.health()) != "healthy":
        assert status == "starting", f"health: {status}\n{box.logs()[-3000:]}"
        assert time.monotonic() - box.started < timeout, f"not healthy after {timeout} s"
        time.sleep(0.5)
    log = json.loads(docker("inspect", "--format", "{{json .State.Health.Log}}", box.name).stdout)
    assert log and log[-1]["ExitCode"] == 0, log
    return time.monotonic() - box.started


def test_healthcheck_reaches_healthy(app, figures):
    seconds = wait_healthy(app)
    figures["healthy after docker run"] = f"{seconds:.0f} s (serving after {app.serving:.0f} s)"


def test_runs_as_uid_1000_with_streamlit_as_pid_1(app):
    assert docker("inspect", "--format", "{{.Config.User}}", app.name).stdout.strip() == "1000:1000"
    assert app.exec("id", "-u").stdout.strip() == "1000"
    status = app.exec("cat", "/proc/1/status").stdout
    uids = re.search(r"^Uid:\s+(.*)$", status, re.M).group(1).split()
    assert set(uids) == {"1000"}, uids
    # `attnviz app` execs Streamlit: the server is PID 1, so `docker stop`'s SIGTERM reaches it.
    assert "streamlit" in app.exec("cat", "/proc/1/cmdline").stdout
    # The code is root's: the app user cannot change what it runs or the baked models.
    code = "import attnviz, os; print(os.path.dirname(attnviz.__file__))"
    site = app.exec("python", "-c", code).stdout.strip()
    for folder, file in ((site, "__init__.py"), ("/opt/attnviz/models/smollm2-135m", "config.json")):
        assert app.exec("test", "-w", folder, check=False).returncode != 0, (
            f"{folder} is writable by uid 1000"
        )
        assert app.exec("test", "-r", f"{folder}/{file}", check=False).returncode == 0, f"{folder} unreadable"


def test_page_draws_the_explorer_from_the_baked_model(app, figures):
    """Chromium opens the page: the explorer's heatmaps of the built-in SmolLM2 draw, no error or
    exception box, and nothing is converted or downloaded at the first view (baked in)."""
    code = "from attnviz.loading import needs_conversion as n; assert not n('smollm2-135m')"
    assert app.exec("python", "-c", code, check=False).returncode == 0
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
        cpu0, t0 = app.cpu_seconds(), time.monotonic()
        page.goto(app.url + "/")
        wait_idle(page, timeout_ms=240_000)
        first_view, cpu = time.monotonic() - t0, app.cpu_seconds() - cpu0
        bad = [a for a in alerts(page) if re.search(r"rror|went wrong|Traceback", a)]
        assert not bad, bad
        assert page.locator('[data-testid="stException"]').count() == 0
        drawn = charts(page)
        heads = [c for c in drawn if c["traces"] == 1 and "smollm2-135m · layer 0 · head 0" in c["title"]]
        assert heads, [c["title"] for c in drawn]
        z = np.array(heads[-1]["z"], dtype=float)
        assert z.shape[0] > 3 and np.allclose(np.nansum(z, -1), 1, atol=1e-3)  # softmax rows
        assert len(drawn) >= 2, "the explorer draws the layer's heads and the single head"
        OUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUT / "explorer.png"), full_page=True)
    figures["first view in the container"] = (
        f"{first_view:.1f} s wall, {cpu:.1f} s CPU in the container (goto to every chart drawn, Chromium)"
    )
    changed = docker("diff", app.name).stdout
    assert "/opt/attnviz" not in changed and "/opt/venv" not in changed, changed
    assert not re.search(r"convert|downloading", app.logs(), re.I), app.logs()[-3000:]


def test_extract_runs_inside_offline_and_matches_this_machine(image, tmp_path, figures):
    """The README's `attnviz extract` in the container with no network at all (--network none),
    writing to the mounted /data; its attention equals this machine's, same model and torch."""
    import attnviz

    out = tmp_path / "data"
    out.mkdir()
    out.chmod(0o777)
    argv = readme(r"^docker run --rm -v attnviz-data:/data attnviz attnviz extract ")
    run = as_run(argv, image=image, port=None, volume=str(out), network="none")
    run = [a for a in run if a != "attnviz-data:/data"]
    t0 = time.monotonic()
    proc = docker(*run, timeout=600)
    figures["extract in the container (offline)"] = f"{time.monotonic() - t0:.1f} s"
    npz_name = argv[argv.index("--out") + 1]
    assert re.search(rf"wrote {re.escape(npz_name)}: \d+ tokens, 30 layers x 9 heads", proc.stdout), (
        proc.stdout
    )
    with np.load(out / npz_name) as saved:
        inside = saved["attentions"]
        tokens = list(saved["tokens"])
    text = argv[argv.index("--text") + 1]
    here = attnviz.extract(attnviz.load_model("smollm2-135m", device="cpu"), text)
    assert tokens == list(here.tokens.display)
    mine = here.all_layers()
    assert inside.shape == mine.shape
    np.testing.assert_allclose(inside, mine, rtol=0, atol=1e-6)


LONG = " ".join(["the river bank near the quiet town"] * 80)  # about 560 SmolLM2 tokens


def test_demo_mode_enforces_allow_list_token_cap_and_no_paths(image):
    """The README's `-e ATTNVIZ_DEMO=1` run: only the built-ins are offered, a local path or another
    model in a link is refused (the allowed model is shown instead), there is no token or model
    field, and a text over 512 tokens (the demo's cap; 8192 otherwise) is refused."""
    port = free_port()
    volume = f"attnviz-test-demo-{RUN_ID}"
    argv = as_run(readme(r"^docker run .*ATTNVIZ_DEMO=1"), image=image, port=port, volume=volume)
    try:
        with container(argv, f"attnviz-test-demo-{RUN_ID}", port=port, volume=volume) as demo:
            for model in ("/data", "../..", "gpt2"):
                run = run_session(demo.url, urllib.parse.urlencode({"model": model, "text": TEXT}))
                assert run.status == "FINISHED_SUCCESSFULLY" and not run.exceptions, run
                assert any("not offered on this server" in a for a in run.alerts), (model, run.alerts)
                pickers = [w for w in run.widgets if w["type"] == "selectbox" and w["label"] == "Model"]
                offered = {o.split(" ")[0] for o in pickers[0]["options"]} if pickers else None
                assert offered == {"smollm2-135m", "minilm-l6"}, pickers
                assert not [w for w in run.widgets if w["type"] == "text_input"], run.widgets
                assert run.figures
            capped = run_session(demo.url, urllib.parse.urlencode({"text": LONG}))
            assert any("the limit is 512" in a or "reads at most 512 " in a for a in capped.alerts), (
                capped.alerts
            )
            assert not capped.figures
    finally:
        docker("volume", "rm", "-f", volume, check=False)


@pytest.fixture
def hub_repo(tmp_path) -> Path:
    import tiny

    folder = tmp_path / "tiny-llama"
    tiny.model("llama-gqa").save_pretrained(folder)
    tiny.tokenizer("decoder").save_pretrained(folder)
    return folder


def test_stop_and_a_new_container_keep_hub_downloads_and_outputs_on_the_volume(app, image, hub_repo, figures):
    """In the running app container, a real Hub download (huggingface_hub against a stand-in Hub
    on the host) and an output file land on /data. `docker stop` ends the container within 10 s
    (SIGTERM reaches Streamlit: exit 0, not the SIGKILL's 137). A new container on the same volume,
    with the Hub gone: the output is there and the model loads from the volume, in the CLI and in
    the app. (The last test of the app container.)"""
    from fake_hub import fake_hub

    gateway = docker("network", "inspect", "--format", "{{(index .IPAM.Config 0).Gateway}}", NETWORK).stdout
    extract = ["attnviz", "extract", "--model", "tiny/llama", "--text", TEXT]
    with fake_hub({"tiny/llama": hub_repo}, host=gateway.strip()) as hub:
        first = docker(
            "exec", "-e", f"HF_ENDPOINT={hub.url}", app.name, *extract, "--out", "out/tiny.npz"
        ).stdout
        assert any(r.startswith("GET") and r.endswith("/model.safetensors") for r in hub.requests), (
            hub.requests
        )
    assert "models--tiny--llama" in app.exec("ls", "/data/hf/hub").stdout

    t0 = time.monotonic()
    docker("stop", app.name)
    seconds = time.monotonic() - t0
    figures["docker stop"] = f"{seconds:.1f} s"
    code = docker("inspect", "--format", "{{.State.ExitCode}}", app.name).stdout.strip()
    assert seconds < 10 and code == "0", (seconds, code)

    port = free_port()
    argv = as_run(
        readme(r"^docker run -p 8501:8501 -v attnviz-data:/data attnviz$"),
        image=image,
        port=port,
        volume=app.volume,
    )
    argv[argv.index("run") + 1 : argv.index("run") + 1] = ["-e", "HF_HUB_OFFLINE=1"]
    with container(argv, f"attnviz-test-again-{RUN_ID}", port=port, volume=app.volume) as box:
        again = box.exec(*extract, "--out", "out/again.npz").stdout
        assert first.split(":", 1)[1] == again.split(":", 1)[1], (first, again)
        code = (
            "import numpy as np; a, b = np.load('out/tiny.npz'), np.load('out/again.npz'); "
            "print(np.array_equal(a['attentions'], b['attentions']))"
        )
        assert box.exec("python", "-c", code).stdout.strip() == "True"
        session = run_session(box.url, urllib.parse.urlencode({"model": "tiny/llama", "text": TEXT}))
        assert session.status == "FINISHED_SUCCESSFULLY" and not session.exceptions, session
        assert session.figures, session.alerts


def test_cuda_build_runs_the_cuda_install(image):
    """The README's `--build-arg TORCH=cuda` build (on this machine's base and network) runs
    scripts/install.sh --cuda, which asks the CUDA index for torch 2.13.0; that index cannot be
    reached here, so the build stops there, at that request (and never falls back to another torch)."""
    cuda = readme(r"^docker build .*TORCH=cuda")
    offline = readme(r"^docker build .*TORCH=wheel")
    here = offline[2 : offline.index("BASE_IMAGE=attnviz-base") + 1]  # --network host, the base
    argv = as_build(cuda, f"{TAG}-cuda")
    argv[2:2] = [*here, "--force-rm"]  # (no failed build container left behind)
    proc, _ = build(argv, OUT / "build-cuda.log")
    log = proc.stdout + proc.stderr
    assert "TORCH=cuda" in shlex.join(argv) and proc.returncode != 0, log[-3000:]
    assert re.search(r"Step \d+/\d+ : RUN case .*cuda\) bash scripts/install.sh --cuda --deps-only", log)
    asked = set(re.findall(r"Retrying .*': (/\S+)", log))  # what pip asked for, from its warnings
    assert asked == {"/whl/cu128/torch/"}, log[-3000:]  # the CUDA 12.8 index, for torch, only
    assert "No matching distribution found for torch==2.13.0" in log, log[-3000:]
    assert "Successfully built" not in log
    docker("rmi", f"{TAG}-cuda", check=False)


def context_copy(dest: Path) -> Path:
    """The build context as a clean clone has it (git's files) plus wheels/, in ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for rel in [f for f in listed if f and (ROOT / f).is_file()]:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    for wheel in (ROOT / "wheels").glob("*.whl"):
        (dest / "wheels").mkdir(exist_ok=True)
        os.link(wheel, dest / "wheels" / wheel.name)
    return dest


def test_a_change_to_the_app_rebuilds_from_the_cached_layers(image, tmp_path, figures):
    """Cache-friendly layers: after a change to a page, the dependencies, the converted models
    and the venv copy come from the cache; only the app's files and its install run again."""
    ctx = context_copy(tmp_path / "ctx")
    page = ctx / "ui" / "shell.py"
    page.write_text(page.read_text() + "\n# a change\n")
    argv = as_build(readme(r"^docker build .*TORCH=wheel"), f"{TAG}-rebuild")
    proc, seconds = build(argv, OUT / "build-rebuild.log", context=ctx)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    steps = re.split(r"\nStep \d+/\d+ : ", log)
    cached = {s.split("\n", 1)[0][:60]: "Using cache" in s for s in steps[1:]}
    for step in ("RUN case", "RUN ATTNVIZ_CACHE=", "COPY --from=deps", "COPY --from=models"):
        hits = [hit for name, hit in cached.items() if name.startswith(step)]
        assert hits == [True], (step, cached)
    assert not cached[next(n for n in cached if n.startswith("COPY ui"))]
    figures["rebuild after a change to ui/"] = f"{seconds:.0f} s"
    docker("rmi", f"{TAG}-rebuild")


def compose() -> list[str]:
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.fail(
        "no Docker Compose (docker compose / docker-compose): make test-docker installs it", pytrace=False
    )


def test_compose_up_serves_the_app_on_its_named_volume(image, figures):
    """The README's `docker compose` commands: `up -d` serves the image (built above; compose's
    build section takes the same build arguments) on ATTNVIZ_PORT with the named volume and
    becomes healthy, `down` keeps the volume; the GPU file adds the CUDA build and the GPU
    reservation. (The page itself is the app container's test: the same image.)"""
    import yaml

    port = free_port()
    volume = f"attnviz-test-compose-{RUN_ID}"
    env = {
        **os.environ,
        "COMPOSE_PROJECT_NAME": f"attnviz-test-{RUN_ID}",
        "ATTNVIZ_IMAGE": f"{TAG}-compose",
        "ATTNVIZ_VOLUME": volume,
        "ATTNVIZ_PORT": str(port),
        "BASE_IMAGE": "attnviz-base",
        "TORCH": "wheel",
        "BUILD_NETWORK": "host",
    }
    tool = compose()
    up, gpu, down = (
        readme(r"^docker compose up -d$"),
        readme(r"compose\.gpu\.yaml"),
        readme(r"compose down$"),
    )

    def run(argv: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [*tool, *argv[2:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert proc.returncode == 0, f"{argv}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc

    config = yaml.safe_load(run([*gpu[:-2], "config"]).stdout)["services"]["attnviz"]
    assert config["build"]["args"]["TORCH"] == "cuda"
    assert config["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    plain = yaml.safe_load(run([*up[:-2], "config"]).stdout)["services"]["attnviz"]
    assert plain["image"] == env["ATTNVIZ_IMAGE"] and plain["build"]["network"] == "host"
    assert plain["build"]["args"] == {"BASE_IMAGE": "attnviz-base", "TORCH": "wheel"}  # as `docker build`
    try:
        t0 = time.monotonic()
        run(up)
        project = f"label=com.docker.compose.project={env['COMPOSE_PROJECT_NAME']}"
        name = docker("ps", "--format", "{{.Names}}", "--filter", project).stdout.split()
        assert len(name) == 1, name
        box = Box(name[0], f"http://127.0.0.1:{port}", volume, t0)
        box.serving = wait_serving(box)
        wait_healthy(box)
        mounts = json.loads(docker("inspect", "--format", "{{json .Mounts}}", box.name).stdout)
        assert [m["Name"] for m in mounts if m["Destination"] == "/data"] == [volume]
        with urllib.request.urlopen(box.url + "/", timeout=30) as page:  # the app's page, on ATTNVIZ_PORT
            assert page.status == 200 and "<script" in page.read().decode().lower()
        figures["compose up to healthy"] = f"{time.monotonic() - t0:.0f} s"
        run(down)
        assert docker("volume", "inspect", volume, check=False).returncode == 0, "down removed the volume"
    finally:
        subprocess.run([*tool, "down", "-v"], cwd=ROOT, env=env, capture_output=True, timeout=300)
        docker("volume", "rm", "-f", volume, check=False)
        docker("rmi", f"{TAG}-compose", check=False)
