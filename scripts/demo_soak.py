"""Soak a public demo server for a given time: a light, steady mix of visitors (staying, leaving,
editing, Explain, patching, the Head atlas) and what the server does over time.

    python scripts/demo_soak.py --minutes 60               # the hour in docs/robustness.md
    python scripts/demo_soak.py --minutes 3 --every 6      # the slow test's version

It starts ``streamlit run app.py`` with ``ATTNVIZ_DEMO=1`` on 127.0.0.1 (loopback only; nothing
else is contacted), lets one visitor in every ``--every`` seconds (at most ``--concurrent`` at a
time; texts cycle through ``--texts`` distinct ones so the result cache both hits and evicts) and
records:

- the server's resident memory (process and children), sampled each minute; the peak (sampled
  every few seconds) and the final;
- the result cache's entries, bytes and evictions, live results and kept sessions (a
  diagnostics hook the soak loads into the server as ``sitecustomize``; SIGUSR1 makes it write);
- the queue's longest wait (the oldest ticket in the status file the gate's watchdog rewrites,
  and the longest wait a visitor measured);
- the container health check's answers (`attnviz.server.healthcheck.check`, every 15 s);
- ERROR lines in the server's log.

It prints a summary, writes it as JSON (``--json``) and exits 1 when memory grew after warm-up
(final over 1.1x the warm-up mark: minute 10, or a third of a shorter run), a health check went
unhealthy or unanswered, an ERROR line was logged, or the queue did not drain at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import server_diag
from demo_load import ROOT, Visit, app_server, free_port, fresh_atlas_cache, visit

sys.path.insert(0, str(ROOT))
from attnviz.server.healthcheck import check, read_status

log = logging.getLogger("demo_soak")

# visitor kinds, weighted: most read one text; some leave or edit while they wait; a few explain,
# patch or open the atlas (the heavy pages)
MIX = {"stay": 4, "leave": 2, "edit": 2, "explain": 1, "patching": 1, "atlas": 1}
HEALTH_EVERY = 15.0
PEAK_EVERY = 5.0
GROWTH_BOUND = 1.1

DIAG_HOOK = server_diag.hook("ATTNVIZ_SOAK_DIAG")


@dataclass
class Sample:
    minute: float
    rss_mib: float
    diag: dict = field(default_factory=dict)


@dataclass
class Record:
    """Everything the soak saw (written as JSON)."""

    minutes: float
    every: float
    samples: list[Sample] = field(default_factory=list)
    peak_rss_mib: float = 0.0
    health_ok: int = 0
    health_bad: list[str] = field(default_factory=list)  # unhealthy or unanswered: the lines
    longest_queue_wait: float = 0.0  # oldest ticket seen in the status file (s)
    visits: list[dict] = field(default_factory=list)
    error_lines: list[str] = field(default_factory=list)
    drained: bool = False
    load_average: list[float] = field(default_factory=list)


class Soak:
    def __init__(self, url: str, proc: subprocess.Popen, status_file: Path, diag_file: Path) -> None:
        self.url, self.proc, self.status_file, self.diag_file = url, proc, status_file, diag_file
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def rss(self) -> int:
        import psutil

        with contextlib.suppress(psutil.Error):
            p = psutil.Process(self.proc.pid)
            return p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))
        return 0

    def diag(self, timeout: float = 30) -> dict:
        answer = server_diag.ask(self.proc.pid, self.diag_file, timeout)
        return {"error": "no answer to the diagnostics signal"} if answer is None else answer

    def watch(self, rec: Record, t0: float) -> None:
        """Peak RSS every few seconds, health every 15 s, a full sample every minute."""
        next_health, next_sample = 0.0, 60.0
        while not self.stop.wait(PEAK_EVERY):
            now = time.monotonic() - t0
            rss = self.rss() / 2**20
            rec.peak_rss_mib = max(rec.peak_rss_mib, rss)
            if now >= next_health:
                next_health = now + HEALTH_EVERY
                self.health(rec)
            if now >= next_sample:
                next_sample += 60.0
                rec.samples.append(Sample(round(now / 60, 2), round(rss, 1), self.diag()))
                rec.load_average.append(round(os.getloadavg()[0], 2))
                log.info("minute %.0f: RSS %.0f MiB, %s", now / 60, rss, rec.samples[-1].diag)

    def health(self, rec: Record) -> None:
        ok, line = check(self.url + "/_stcore/health", self.status_file)
        if ok:
            rec.health_ok += 1
        else:
            rec.health_bad.append(f"{time.strftime('%H:%M:%S')} {line}")
            log.warning("health check: %s", line)
        with contextlib.suppress(OSError, ValueError):
            status = read_status(self.status_file)
            if status is not None:
                rec.longest_queue_wait = max(rec.longest_queue_wait, float(status["oldest_wait"]))

    def visitors(self, rec: Record, seconds: float, every: float, concurrent: int, n_texts: int) -> None:
        """One visitor every ``every`` s (jittered) until ``seconds`` pass, at most ``concurrent``."""
        rng = random.Random(7)
        kinds = [k for k, w in MIX.items() for _ in range(w)]
        end = time.monotonic() + seconds
        alive: list[threading.Thread] = []
        i = 0
        while time.monotonic() < end and self.proc.poll() is None:
            alive = [t for t in alive if t.is_alive()]
            if len(alive) < concurrent:
                v = Visit(rng.choice(kinds), i % n_texts)
                i += 1
                t = threading.Thread(target=self.one, args=(v, rec, random.Random(i)), daemon=True)
                t.start()
                alive.append(t)
            time.sleep(every * rng.uniform(0.5, 1.5))
        for t in alive:
            t.join(240)

    def one(self, v: Visit, rec: Record, rng: random.Random) -> None:
        visit(self.url, v, time.monotonic() + 180, rng)
        with self.lock:
            rec.visits.append({"kind": v.kind, "wait": round(v.wait, 2), "status": v.status,
                               "busy_seen": v.busy_seen, "full": v.full, "errors": v.errors})  # fmt: skip


@contextlib.contextmanager
def demo_server(folder: Path, log_path: Path, extra_env: dict[str, str]):
    """A demo server on a free loopback port with the status file and the diagnostics hook."""
    port = free_port()
    hook = folder / "hook"
    hook.mkdir(parents=True, exist_ok=True)
    (hook / "sitecustomize.py").write_text(DIAG_HOOK)
    status_file, diag_file = folder / "status.json", folder / "diag.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNVIZ_", "STREAMLIT_"))}
    env.update(
        ATTNVIZ_DEMO="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
        ATTNVIZ_STATUS_FILE=str(status_file), ATTNVIZ_SOAK_DIAG=str(diag_file),
        ATTNVIZ_CACHE=str(fresh_atlas_cache(folder / "cache")),
        PYTHONPATH=os.pathsep.join([str(hook), str(ROOT)]),
    )  # fmt: skip
    env.update(extra_env)
    with app_server(env, port, log_path) as (url, proc):
        yield Soak(url, proc, status_file, diag_file)


def warm_mark(rec: Record) -> Sample | None:
    """The sample memory is compared against: minute 10, or a third of a shorter run."""
    if not rec.samples:
        return None
    mark = min(10.0, max(1.0, rec.minutes / 3))
    return min(rec.samples, key=lambda s: abs(s.minute - mark))


def verdict(rec: Record) -> dict:
    """The figures docs/robustness.md quotes and whether the soak passed."""
    mark = warm_mark(rec)
    final = rec.samples[-1] if rec.samples else None
    ratio = final.rss_mib / mark.rss_mib if final and mark and mark.rss_mib else None
    last = final.diag.get("results", {}) if final else {}
    waits = [v["wait"] for v in rec.visits if v["kind"] != "leave" and v["status"] == "FINISHED_SUCCESSFULLY"]
    unfinished = [v for v in rec.visits if v["kind"] != "leave" and v["status"] != "FINISHED_SUCCESSFULLY"]
    out = {
        "minutes": rec.minutes,
        "visitors": len(rec.visits),
        "by_kind": {k: sum(v["kind"].startswith(k) for v in rec.visits) for k in MIX},
        "unfinished_visitors": len(unfinished),
        "peak_rss_mib": round(rec.peak_rss_mib, 1),
        "warm_mark_minute": mark.minute if mark else None,
        "warm_mark_rss_mib": mark.rss_mib if mark else None,
        "final_rss_mib": final.rss_mib if final else None,
        "final_over_warm": round(ratio, 3) if ratio else None,
        "result_cache_entries": last.get("entries"),
        "result_cache_mib": round(last["mib"], 1) if "mib" in last else None,
        "result_cache_evictions": last.get("evictions"),
        "results_alive": final.diag.get("results_alive") if final else None,
        "sessions_kept": final.diag.get("sessions_kept") if final else None,
        "longest_queue_wait_s": round(rec.longest_queue_wait, 1),
        "longest_visitor_wait_s": round(max(waits, default=0.0), 1),
        "health_ok": rec.health_ok,
        "health_bad": len(rec.health_bad),
        "error_lines": len(rec.error_lines),
        "drained": rec.drained,
        "load_average_max": max(rec.load_average, default=None),
    }
    out["passed"] = bool(
        ratio is not None and ratio <= GROWTH_BOUND and not rec.health_bad and not rec.error_lines
        and rec.drained
    )  # fmt: skip
    return out


def run(
    minutes: float, every: float, concurrent: int, n_texts: int, log_path: Path, extra_env: dict
) -> Record:
    rec = Record(minutes=minutes, every=every)
    with (
        tempfile.TemporaryDirectory(prefix="attnviz-soak-") as tmp,
        demo_server(Path(tmp), log_path, extra_env) as soak,
    ):
        warm = Visit("warm", 0)
        visit(soak.url, warm, time.monotonic() + 300, random.Random(0))  # the model loads (converts) once
        log.info("warm-up visitor: %.1f s (%s)", warm.wait, warm.status)
        t0 = time.monotonic()
        rec.samples.append(Sample(0.0, round(soak.rss() / 2**20, 1), soak.diag()))
        watcher = threading.Thread(target=soak.watch, args=(rec, t0), daemon=True)
        watcher.start()
        soak.visitors(rec, minutes * 60, every, concurrent, n_texts)
        soak.stop.set()
        watcher.join(30)
        soak.health(rec)
        rec.samples.append(
            Sample(round((time.monotonic() - t0) / 60, 2), round(soak.rss() / 2**20, 1), soak.diag())
        )
        after = Visit("after", 10_000)
        visit(soak.url, after, time.monotonic() + 120, random.Random(1))
        rec.drained = after.status == "FINISHED_SUCCESSFULLY" and not after.busy_seen
        text = log_path.read_text(errors="replace")
        rec.error_lines = [
            line[:300] for line in text.splitlines() if re.search(r"\bERROR\b|Traceback", line)
        ]
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--every", type=float, default=5.0, help="seconds between visitors (jittered)")
    ap.add_argument("--concurrent", type=int, default=3, help="visitors at once, at most (≤ 8)")
    ap.add_argument("--texts", type=int, default=40, help="distinct texts the visitors cycle through")
    ap.add_argument("--json", default=str(ROOT / "test-output" / "demo_soak.json"))
    ap.add_argument("--log", default=str(ROOT / "test-output" / "demo_soak_server.log"))
    ap.add_argument("--result-cache-mb", type=int, default=0, help="ATTNVIZ_RESULT_CACHE_MB (0: default)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    log_path, json_path = Path(args.log), Path(args.json)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    extra = {"ATTNVIZ_RESULT_CACHE_MB": str(args.result_cache_mb)} if args.result_cache_mb else {}
    every = max(args.every, 1.0)
    rec = run(
        max(args.minutes, 1.0), every, max(1, min(args.concurrent, 8)), max(args.texts, 1), log_path, extra
    )
    summary = verdict(rec)
    json_path.write_text(json.dumps({"summary": summary, "record": asdict(rec)}, indent=1))
    for key, value in summary.items():
        print(f"{key:24s} {value}")
    for line in rec.health_bad[:5] + rec.error_lines[:10]:
        print(f"  {line}")
    print(f"written: {json_path} (server log {log_path})")
    sys.exit(0 if summary["passed"] else 1)


if __name__ == "__main__":
    main()
