"""Real data for the dashboard's picture: a fleet's story, scraped from the monitor's /metrics.

Runs inside a VM of integration/vm.py (as root, the system manager), never
on a host one cares about: a tool call runs the machine short until the
memory guard kills it. ``dashboards/shot.py capture`` boots it:

    python integration/vm.py -d trixie -m system --memory 1536M --timeout 900 \\
        --run "python dashboard_capture.py"

It starts ``agentscope monitor --listen 127.0.0.1:9464 --guard`` and a small
fleet, scrapes ``/metrics`` every 2 s as Prometheus would (recording when
each scrape began), and plays this story (seconds from the start):

- planner, coder-1, reviewer hold a few MB each and idle; coder-1 is
  stopped and launched again at 110 (its series go on under the same labels);
- indexer's tool call grows by 4 MiB every 3 s to 160 MiB, then holds;
- tester runs with MemoryMax=128M: its tool call grows until the kernel
  OOM-kills it inside the scope, three times (at about 30, 75, 120);
- docs allocates 96 MiB under a MemoryHigh=48M set by hand (the limit the
  monitor reports as throttling), lifted at 62, after about 10 s of it;
- coder-2's tool call runs away, uncapped, at 185: the guard kills it when
  MemAvailable falls to 10 %.

At 270 s everything is stopped. The scrapes, and the monitor's events
(``--json``), are printed gzip+base64 between ``@@SHOT-BEGIN@@`` and
``@@SHOT-END@@`` on stdout, which the VM's serial carries to the host. The
run is bounded: every wait has a deadline, and agents are stopped on the way
out whatever happened.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import os
import platform
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import agentscope_systemd

PORT = 9464
SCRAPE_INTERVAL = 2.0
DURATION = 270.0
FLEET = "shot"
MARK_BEGIN, MARK_END = "@@SHOT-BEGIN@@", "@@SHOT-END@@"
# What Prometheus 2.42 sends first (scrape_config's default): OpenMetrics.
ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)

# An agent holds N MB in a shell variable and idles; cheap under TCG.
HOLD = 'x=$(head -c $(($1 * 1048576)) /dev/zero | tr "\\0" x)\n'
STEADY = HOLD + "while :; do sleep 3600; done\n"
# 4 MiB every 3 s up to 160 MiB, then held: the slow grower.
GROW_SLOWLY = (
    "import time\nchunks = []\nfor _ in range(40):\n"
    "    chunks.append(b'x' * (4 << 20))\n    time.sleep(3)\ntime.sleep(3600)\n"
)
# The capped tool call: 8 MiB every 0.1 s after 3 s of start-up (so the
# monitor's 2 s samples see it before the kernel kills it in its scope).
GROW_CAPPED = (
    "import time\ntime.sleep(3)\nchunks = []\nwhile True:\n"
    "    chunks.append(b'x' * (8 << 20))\n    time.sleep(0.1)\n"
)
# The runaway of issue #20: 16 MiB every 20 ms, each chunk touched at once.
RUNAWAY = (
    "import time\ntime.sleep(2)\nchunks = []\nwhile True:\n"
    "    chunks.append(b'x' * (16 << 20))\n    time.sleep(0.02)\n"
)
THROTTLED = "import time\nb = b'x' * (96 << 20)\ntime.sleep(3600)\n"


def log(msg: str) -> None:
    print(f"capture: {msg}", file=sys.stderr, flush=True)


class Scraper(threading.Thread):
    """GET /metrics every SCRAPE_INTERVAL until ``stop`` is set; each scrape with its start time."""

    def __init__(self, url: str) -> None:
        super().__init__(name="scraper", daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.scrapes: list[tuple[float, str]] = []
        self.failures = 0

    def run(self) -> None:
        next_at = time.time()
        while not self.stop.is_set():
            started = time.time()
            request = urllib.request.Request(self.url, headers={"Accept": ACCEPT})
            try:
                with urllib.request.urlopen(request, timeout=10) as r:
                    self.scrapes.append((round(started, 3), r.read().decode()))
            except OSError as exc:
                self.failures += 1  # Prometheus would record up == 0; we record nothing
                log(f"scrape failed: {exc}")
            next_at += SCRAPE_INTERVAL
            # A scrape late by more than a period (a stalled guest) is not made up.
            next_at = max(next_at, time.time())
            self.stop.wait(next_at - time.time())


def wait_health(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as r:
            if json.loads(r.read()).get("samples", 0) > 0:
                return
        time.sleep(0.5)
    raise SystemExit("capture: the monitor's face did not answer in time")


def systemctl(*args: str) -> None:
    """systemctl; a failure is logged (the story goes on: its data is what counts)."""
    done = subprocess.run(
        ["systemctl", *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        log(f"systemctl {' '.join(args)}: {done.stderr.strip()}")


def main() -> int:
    work = Path("/tmp/shot")
    work.mkdir(exist_ok=True)
    trigger = work / "runaway"
    trigger.unlink(missing_ok=True)
    events_file = work / "events.jsonl"
    t0 = time.monotonic()
    started = time.time()
    argv = ["agentscope", "monitor", "--fleet", FLEET, "--json", "--guard", "--interval", "2"]
    monitor = subprocess.Popen(
        [*argv, "--listen", f"127.0.0.1:{PORT}"],
        stdin=subprocess.DEVNULL,
        stdout=events_file.open("wb"),
        stderr=(work / "monitor.err").open("wb"),
    )
    scraper = Scraper(f"http://127.0.0.1:{PORT}/metrics")
    fleet = agentscope_systemd.Fleet(FLEET)
    manager = fleet.manager
    timeline: list[tuple[float, str]] = []
    ok = True

    def at(second: float, what: str) -> None:
        """Wait until ``second`` of the story, then note what happens there."""
        time.sleep(max(0.0, t0 + second - time.monotonic()))
        timeline.append((round(time.monotonic() - t0, 1), what))
        log(f"{timeline[-1][0]:6.1f}s {what}")

    def launch(name: str, argv: list[str], **kwargs: Any) -> agentscope_systemd.BlockingAgent:
        return fleet.launch(
            name, argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs
        )

    def steady(name: str, mb: int) -> None:
        launch(name, ["sh", "-c", STEADY, "sh", str(mb)])

    try:
        wait_health(f"http://127.0.0.1:{PORT}/health", time.monotonic() + 120)
        scraper.start()
        at(6, "planner, coder-1, reviewer, indexer, tester, coder-2 start")
        steady("planner", 24)
        steady("coder-1", 40)
        steady("reviewer", 12)
        launch("indexer", ["python3", "-c", GROW_SLOWLY])
        # The capped agent: a shell that runs its tool call three times; the
        # kernel kills each in the scope, and the shell (the agent) lives on.
        capped = HOLD + 'for i in 1 2 3; do sleep 30; python3 -c "$2"; done\nsleep 3600\n'
        launch("tester", ["sh", "-c", capped, "sh", "8", GROW_CAPPED], memory_max=128 << 20)
        runaway = HOLD + 'while [ ! -e "$2" ]; do sleep 0.5; done\npython3 -c "$3"\nsleep 3600\n'
        launch("coder-2", ["sh", "-c", runaway, "sh", "16", str(trigger), RUNAWAY])
        at(45, "docs starts under MemoryHigh=48M")
        docs = launch("docs", ["sh", "-c", 'sleep 4; exec python3 -c "$1"', "sh", THROTTLED])
        # Never set by agentscope (it refuses MemoryHigh): the hand edit a
        # user might have made, which the monitor reports as throttling.
        systemctl("set-property", "--runtime", docs.unit, "MemoryHigh=48M")
        # Lifted after about 10 s of throttling. Longer, and the host's PSI
        # full (the throttled task is all that runs on this idle VM) stays
        # over 60 % for the guard's 10 s: the guard then kills the slice's
        # largest process, here indexer, not the throttled one (seen in a
        # run of this script; a guard matter, not the dashboard's).
        at(62, "docs: MemoryHigh lifted")
        systemctl("set-property", "--runtime", docs.unit, "MemoryHigh=infinity")
        at(110, "coder-1 stopped and launched again")
        fleet.stop("coder-1", timeout=10)
        steady("coder-1", 40)
        at(185, "coder-2's tool call runs away (no cap)")
        trigger.touch()
        at(DURATION, "the end")
    except Exception as exc:  # the scrapes so far are still worth having, and are printed
        log(f"the story stopped early: {exc!r}")
        ok = False
    finally:
        scraper.stop.set()
        scraper.join(15)
        for agent in fleet.agents():
            with contextlib.suppress(agentscope_systemd.AgentscopeError):
                fleet.stop(agent.name, timeout=10)
        fleet.close()
        monitor.terminate()
        try:
            monitor.wait(30)
        except subprocess.TimeoutExpired:
            monitor.kill()
            monitor.wait(10)
    events = [
        json.loads(line)
        for line in events_file.read_text(errors="replace").splitlines()
        if line.startswith("{")
    ]
    for e in events:
        if e.get("kind") != "pressure":
            log(f"event {e.get('kind')} {e.get('agent')} {e.get('comm')} pid {e.get('pid')}")
    kinds = sorted({str(e.get("kind")) for e in events})
    log(f"{len(scraper.scrapes)} scrapes ({scraper.failures} failed), events: {kinds}")
    capture = {
        "format": "agentscope-dashboard-capture/1",
        "scrape_interval_seconds": SCRAPE_INTERVAL,
        "job": "agentscope",
        "instance": f"127.0.0.1:{PORT}",
        "started": started,
        "host": {
            "kernel": platform.release(),
            "systemd": os.environ.get("AGENTSCOPE_TEST_SYSTEMD", ""),
            "distro": os.environ.get("AGENTSCOPE_TEST_DISTRO", ""),
            "manager": manager,
            "mem_total": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "agentscope": agentscope_systemd.__version__,
        },
        "timeline": timeline,
        "events": events,
        "scrape_failures": scraper.failures,
        "scrapes": scraper.scrapes,
    }
    blob = base64.b64encode(gzip.compress(json.dumps(capture).encode(), 9)).decode()
    print(MARK_BEGIN, flush=True)
    for i in range(0, len(blob), 76):
        print(blob[i : i + 76])
    print(MARK_END, flush=True)
    log(f"capture: {len(blob)} base64 characters")
    guard_killed = any(e.get("kind") == "guard_kill" for e in events)
    return 0 if ok and scraper.scrapes and guard_killed else 1


if __name__ == "__main__":
    sys.exit(main())
