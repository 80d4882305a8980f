"""The dashboard's picture: Prometheus evaluates agentscope.json's own queries over a VM run.

    python -m dashboards.shot render   # dashboards/sample/capture.json.gz -> docs/img/dashboard.png
    python -m dashboards.shot capture  # a new capture from a trixie VM (minutes under TCG)

Grafana is not packaged in Debian, so the panels are drawn by
dashboards/draw.py; what they show is Prometheus's answer to each panel's
query. ``render`` turns the capture into OpenMetrics with timestamps, has
``promtool tsdb create-blocks-from openmetrics`` make a TSDB of it, starts
``prometheus`` on that storage (loopback, a free port, a temporary
directory, stopped at the end), and asks ``/api/v1/query_range`` for every
target of every panel over the capture's span, with the dashboard's
variables and Grafana's macros substituted. Needs prometheus and promtool
(Debian: prometheus) and matplotlib (``pip install '.[shot]'``;
``make dashboard-shot`` does it).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dashboards import panels as P

__all__ = ["Series", "capture", "decode", "evaluate", "main", "prometheus", "query_range", "render"]

ROOT = P.HERE.parent
PICTURE = ROOT / "docs" / "img" / "dashboard.png"
MARK_BEGIN, MARK_END = "@@SHOT-BEGIN@@", "@@SHOT-END@@"
#: How long a series lasts past its last sample. Prometheus's scraper ends a
#: series that a scrape no longer shows with a staleness marker; blocks made
#: by promtool have none, so the lookback stands in for them (5 scrapes).
LOOKBACK_SCRAPES = 5


@dataclass(frozen=True)
class Series:
    """One series of a query's answer: its legend name and its points."""

    name: str
    times: tuple[float, ...]
    values: tuple[float, ...]


def _log(msg: str) -> None:
    print(f"shot: {msg}", file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def prometheus(capture: P.Capture, work: Path) -> Iterator[str]:
    """A Prometheus serving the capture's samples on loopback; yields its URL."""
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            raise SystemExit(f"shot: {tool} is not installed (Debian: apt-get install prometheus)")
    openmetrics = work / "capture.om"
    openmetrics.write_text(P.to_openmetrics(capture))
    data = work / "data"
    done = subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(data)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if done.returncode != 0:
        raise SystemExit(f"shot: promtool could not read the capture:\n{done.stderr[-2000:]}")
    config = work / "prometheus.yml"
    config.write_text("global: {}\n")  # no scrape jobs: it only answers queries
    port = _free_port()
    lookback = max(10.0, LOOKBACK_SCRAPES * capture.scrape_interval)
    with (work / "prometheus.log").open("wb") as log:  # the child keeps its own copy
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                # The capture keeps its own dates: no retention may drop it.
                "--storage.tsdb.retention.time=100y",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--query.lookback-delta={lookback:.0f}s",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    url = f"http://127.0.0.1:{port}"
    ready = url + "/-/ready"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                said = (work / "prometheus.log").read_text(errors="replace")
                raise SystemExit(f"shot: prometheus ended at start:\n{said[-2000:]}")
            with contextlib.suppress(OSError), urllib.request.urlopen(ready, timeout=2) as r:
                if r.status == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("shot: prometheus was not ready within 60 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def query_range(url: str, expr: str, legend: str, rng: P.TimeRange) -> list[Series]:
    """Prometheus's answer to ``expr`` over ``rng``, one Series per result.

    Raises:
        SystemExit: Prometheus refused the query (a dashboard query that is not PromQL).
    """
    params = urllib.parse.urlencode(
        {"query": expr, "start": rng.start, "end": rng.end, "step": rng.step}
    )
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query_range?{params}", timeout=60) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"shot: Prometheus refused {expr!r}: {exc.read().decode()}") from exc
    series = []
    for result in body["data"]["result"]:
        points = [(float(t), float(v)) for t, v in result["values"]]
        series.append(
            Series(
                P.legend_name(legend, result["metric"]),
                tuple(t for t, _ in points),
                tuple(v for _, v in points),
            )
        )
    return sorted(series, key=lambda s: s.name)


def evaluate(url: str, dashboard: dict[str, object], rng: P.TimeRange) -> dict[int, list[Series]]:
    """Every target of every panel, as Grafana would ask for it."""
    values = P.template_values(dashboard)
    answers: dict[int, list[Series]] = {}
    for panel in P.load_panels(dashboard):
        answers[panel.id] = []
        for target in panel.targets:
            expr = P.interpolate(target.expr, values, rng)
            got = query_range(url, expr, target.legend, rng)
            answers[panel.id].extend(got)
            if not got:
                _log(f"panel {panel.title!r} {target.ref}: no data for {expr}")
    return answers


def render(capture_path: Path, out: Path) -> None:
    from dashboards import draw

    capture = P.load_capture(capture_path)
    dashboard = json.loads(P.DASHBOARD.read_text())
    rng = P.time_range(capture)
    with (
        tempfile.TemporaryDirectory(prefix="agentscope-shot-") as tmp,
        prometheus(capture, Path(tmp)) as url,
    ):
        answers = evaluate(url, dashboard, rng)
    out.parent.mkdir(parents=True, exist_ok=True)
    draw.draw(dashboard, P.load_panels(dashboard), answers, rng, capture, out)
    empty = [p.title for p in P.load_panels(dashboard) if not answers[p.id]]
    _log(f"wrote {out} ({len(answers)} panels, no data in: {', '.join(empty) or 'none'})")


def decode(output: str) -> bytes:
    """The gzip'd capture printed between the markers of integration/dashboard_capture.py."""
    lines = output.splitlines()
    try:
        begin = next(i for i, line in enumerate(lines) if line.strip().endswith(MARK_BEGIN))
        end = next(i for i, line in enumerate(lines) if line.strip().endswith(MARK_END))
    except StopIteration:
        raise SystemExit("shot: the VM's output has no capture between the markers") from None
    # vm.py may prefix each line with "[distro] ".
    blob = "".join(line.rsplit(" ", 1)[-1].strip() for line in lines[begin + 1 : end])
    return base64.b64decode(blob, validate=True)


def capture(distro: str, out: Path) -> None:
    """Boot a VM, run the capture's story there, keep what it printed."""
    command = [
        sys.executable,
        str(ROOT / "integration" / "vm.py"),
        "-d",
        distro,
        "-m",
        "system",
        "--memory",
        "1536M",
        "--timeout",
        "900",
        "--run",
        "python dashboard_capture.py",
    ]
    _log("booting " + " ".join(command[2:]))
    # The VM's output is shown as it comes (a run takes minutes) and kept.
    kept = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        inside = False  # the base64 lines are kept, not shown
        for line in proc.stdout:
            kept.append(line)
            inside = (inside or MARK_BEGIN in line) and MARK_END not in line
            if not inside:
                print(line, end="", flush=True)
    returncode = proc.returncode
    blob = decode("".join(kept))
    data = json.loads(gzip.decompress(blob))  # a truncated stream fails here, not later
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(blob)
    _log(f"wrote {out}: {len(data['scrapes'])} scrapes, {len(blob) // 1024} KiB")
    if returncode != 0:
        _log(f"the VM run ended with status {returncode}: see its output above")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="draw the picture from a capture")
    r.add_argument("--capture", type=Path, default=P.CAPTURE)
    r.add_argument("--out", type=Path, default=PICTURE)
    c = sub.add_parser("capture", help="capture new data in a VM (integration/vm.py)")
    c.add_argument("--distro", default="trixie")
    c.add_argument("--out", type=Path, default=P.CAPTURE)
    args = p.parse_args(argv)
    if args.command == "render":
        render(args.capture, args.out)
    else:
        capture(args.distro, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
