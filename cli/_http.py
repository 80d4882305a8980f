"""The monitor's HTTP face: ``/health`` (JSON) and ``/metrics`` (Prometheus text).

Opt-in with ``agentscope monitor --listen 127.0.0.1:PORT``. The monitor's own
loop hands each sample to a :class:`FaceState` (:meth:`FaceState.sampled`,
:meth:`FaceState.event`); the server runs on threads of its own and only ever
reads the latest sample from there. A request never calls into the fleet, so
a slow or stuck client cannot stall the monitor or its event loop, and a
scrape costs no D-Bus call and no cgroup read.

Loopback only unless ``--listen-any``: the figures name agents, their command
lines' owners and the host's memory, which is not for the whole network.
Needs prometheus-client (``pip install 'agentscope-systemd[monitor]'``), imported
only when the face is started.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from agentscope import (
    AgentExited,
    Escaped,
    GuardHeld,
    GuardKill,
    LimitFound,
    OomKill,
    Pressure,
    Throttled,
    _numbers,
)
from agentscope._contract import schema_id

from ._errors import BadInput, Failed

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

__all__ = ["FaceState", "HttpFace", "health", "metric_families", "parse_listen", "start_face"]

_PRESSURE_WINDOWS = ("avg10", "avg60", "avg300")
#: Every kind of monitor event, counted from 0: a series born at 1 hides its
#: first event from increase() and rate() (Prometheus sees no change), so the
#: dashboard's first OOM kill would count as none.
_EVENT_KINDS = tuple(
    sorted(
        cls.kind
        for cls in (
            OomKill,
            Throttled,
            Pressure,
            AgentExited,
            LimitFound,
            Escaped,
            GuardKill,
            GuardHeld,
        )
    )
)


def parse_listen(value: str, *, any_address: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` for IPv6) as a (host, port) to bind.

    ``localhost`` means 127.0.0.1. Without ``any_address`` the host must be a
    loopback address; with it, any address or name. Port 0 picks a free port.

    Raises:
        BadInput: not HOST:PORT, a bad port, or a non-loopback address
            without ``any_address``.
    """
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise BadInput(f"--listen {value!r}: expected HOST:PORT, like 127.0.0.1:9464")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not _numbers.is_digits(port_text) or len(port_text) > 5 or int(port_text) > 65535:
        raise BadInput(
            f"--listen {value!r}: the port must be a number from 0 to 65535 (ASCII digits)"
        )
    if host == "localhost":
        host = "127.0.0.1"
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False  # a host name: not resolved here, so not known to be local
    if not loopback and not any_address:
        raise BadInput(
            f"--listen {value!r} is not a loopback address; the metrics name every agent, "
            "so pass --listen-any as well to serve them to the network"
        )
    return host, int(port_text)


@dataclass(frozen=True)
class _Sample:
    ts: float
    agents: tuple[Mapping[str, Any], ...]
    report: Mapping[str, Any] | None
    status: str


@dataclass
class _Counters:
    samples: int = 0
    errors: int = 0
    last_error: str | None = None
    last_error_ts: float | None = None
    events: dict[str, int] = field(default_factory=dict)
    last_event: Mapping[str, Any] | None = None
    # The OOM watch's own samples (Monitor.failures, .consecutive_failures).
    watch_failures: int = 0
    watch_failing: int = 0


#: Failed OOM-watch samples in a row that make /health report an error.
WATCH_FAILING = 3


class FaceState:
    """What the monitor saw last, shared between its loop and the HTTP threads.

    ``period`` is the monitor's sampling period: a sample older than three
    periods (at least 10 s) makes ``/health`` report ``stale``.
    """

    def __init__(self, fleet: str, manager: str, period: float, version: str = "") -> None:
        self.fleet = fleet
        self.manager = manager
        self.period = period
        self.version = version
        self.started = time.time()
        self._lock = threading.Lock()
        self._sample: _Sample | None = None
        self._counters = _Counters()
        #: Whether the monitor's memory guard runs (None: started without one).
        self.guard: Callable[[], bool] | None = None

    def sampled(
        self,
        agents: Sequence[Mapping[str, Any]],
        report: Mapping[str, Any] | None,
        status: str,
        *,
        now: float | None = None,
    ) -> None:
        """Record one sample: the agents (``to_dict()`` each), a report's dict, the STATUS line."""
        sample = _Sample(time.time() if now is None else now, tuple(agents), report, status)
        with self._lock:
            self._sample = sample
            self._counters.samples += 1

    def failed(self, error: BaseException | str, *, now: float | None = None) -> None:
        """Record a sample that could not be taken (counted in the scrape errors)."""
        with self._lock:
            self._counters.errors += 1
            self._counters.last_error = str(error)
            self._counters.last_error_ts = time.time() if now is None else now

    def watch(self, failures: int, in_a_row: int) -> None:
        """Record the OOM watch's failed samples: in all, and in a row now."""
        with self._lock:
            self._counters.watch_failures = failures
            self._counters.watch_failing = in_a_row

    def event(self, data: Mapping[str, Any]) -> None:
        """Count one monitor event (its ``to_dict()``); the last one shows in /health."""
        kind = str(data.get("kind", "unknown"))
        summary = {k: data[k] for k in ("kind", "ts", "agent", "unit", "pid") if k in data}
        with self._lock:
            self._counters.events[kind] = self._counters.events.get(kind, 0) + 1
            self._counters.last_event = summary

    def read(self) -> tuple[_Sample | None, _Counters]:
        """The latest sample and a copy of the counters, consistent with each other."""
        with self._lock:
            counters = replace(self._counters, events=dict(self._counters.events))
            return self._sample, counters


def health(state: FaceState, *, now: float | None = None) -> tuple[int, dict[str, Any]]:
    """The HTTP status and the JSON body of ``/health``.

    ``status`` is ``ok`` (200) while samples come in on time; ``starting``
    before the first, ``stale`` when the last is too old, ``error`` when the
    last attempt failed or the OOM watch failed its last 3 samples (503 for
    all three).
    """
    now = time.time() if now is None else now
    sample, counters = state.read()
    states: dict[str, int] = {}
    for agent in sample.agents if sample else ():
        key = str(agent.get("state"))
        states[key] = states.get(key, 0) + 1
    if counters.watch_failing >= WATCH_FAILING:
        status = "error"  # the OOM watch itself fails: kills would go unseen
    elif sample is None:
        status = "error" if counters.last_error else "starting"
    elif counters.last_error_ts is not None and counters.last_error_ts > sample.ts:
        status = "error"
    elif now - sample.ts > max(3 * state.period, 10.0):
        status = "stale"
    else:
        status = "ok"
    body: dict[str, Any] = {
        "schema": schema_id("health"),
        "status": status,
        "fleet": state.fleet,
        "manager": state.manager,
        "version": state.version,
        "uptime_seconds": round(now - state.started, 3),
        "agents": len(sample.agents) if sample else 0,
        "agents_by_state": dict(sorted(states.items())),
        "last_sample": None if sample is None else sample.ts,
        "last_sample_age_seconds": None if sample is None else round(now - sample.ts, 3),
        "last_report": None if sample is None else _summary(sample),
        "samples": counters.samples,
        "sample_errors": counters.errors,
        "last_error": counters.last_error,
        "watch_sample_failures": counters.watch_failures,
        "watch_failures_in_a_row": counters.watch_failing,
        "events": dict(sorted(counters.events.items())),
        "last_event": counters.last_event,
    }
    return (200 if status == "ok" else 503), body


def _summary(sample: _Sample) -> dict[str, Any]:
    report = sample.report or {}
    host = report.get("host") or {}
    pressure = report.get("pressure") or {}
    return {
        "status": sample.status,
        "memory_current": sum(a.get("memory_current") or 0 for a in sample.agents),
        "oom_kills": sum(a.get("oom_kills") or 0 for a in sample.agents),
        "slice_memory_current": report.get("slice_memory_current"),
        "host_mem_available": host.get("mem_available"),
        "host_pressure_some_avg10": (pressure.get("some") or {}).get("avg10"),
    }


def metric_families(state: FaceState) -> Iterable[Any]:
    """The Prometheus metric families of the latest sample (what ``/metrics`` shows)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    sample, counters = state.read()
    fleet = state.fleet
    info = GaugeMetricFamily(
        "agentscope_monitor_info",
        "The monitor serving these metrics (always 1).",
        labels=["fleet", "manager", "version"],
    )
    info.add_metric([fleet, state.manager, state.version], 1)
    yield info
    samples = CounterMetricFamily(
        "agentscope_monitor_samples", "Samples the monitor took.", labels=["fleet"]
    )
    samples.add_metric([fleet], counters.samples)
    yield samples
    errors = CounterMetricFamily(
        "agentscope_monitor_sample_errors",
        "Samples that failed (a cgroup or /proc file that could not be read).",
        labels=["fleet"],
    )
    errors.add_metric([fleet], counters.errors)
    yield errors
    watch = CounterMetricFamily(
        "agentscope_monitor_watch_sample_failures",
        "Samples of the OOM watch (memory.events, cgroup.procs) that failed.",
        labels=["fleet"],
    )
    watch.add_metric([fleet], counters.watch_failures)
    yield watch
    events = CounterMetricFamily(
        "agentscope_monitor_events",
        "Monitor events by kind (oom_kill, throttled, pressure, ...) since it started.",
        labels=["fleet", "kind"],
    )
    for kind, count in sorted({**dict.fromkeys(_EVENT_KINDS, 0), **counters.events}.items()):
        events.add_metric([fleet, kind], count)
    yield events
    if state.guard is not None:
        guard = GaugeMetricFamily(
            "agentscope_guard_running",
            "1 while the monitor's memory guard runs, 0 once it stopped.",
            labels=["fleet"],
        )
        guard.add_metric([fleet], 1 if state.guard() else 0)
        yield guard
    kills = CounterMetricFamily(
        "agentscope_guard_kills",
        "Processes the memory guard killed since the monitor started.",
        labels=["fleet"],
    )
    kills.add_metric([fleet], counters.events.get("guard_kill", 0))
    yield kills
    if sample is None:
        return
    last = GaugeMetricFamily(
        "agentscope_monitor_last_sample_timestamp_seconds",
        "When the monitor last took a sample (Unix time).",
        labels=["fleet"],
    )
    last.add_metric([fleet], sample.ts)
    yield last
    yield from _agent_families(fleet, sample.agents)
    if sample.report is not None:
        yield from _report_families(fleet, sample.report)


def _agent_families(fleet: str, agents: Sequence[Mapping[str, Any]]) -> Iterable[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    states: dict[str, int] = dict.fromkeys(("running", "frozen", "starting", "stopping"), 0)
    for agent in agents:
        states[str(agent.get("state"))] = states.get(str(agent.get("state")), 0) + 1
    by_state = GaugeMetricFamily(
        "agentscope_agents", "Agents of the fleet by state.", labels=["fleet", "state"]
    )
    for name, count in sorted(states.items()):
        by_state.add_metric([fleet, name], count)
    yield by_state
    # An agent's identity is its fleet and name: a relaunch (a new unit, a
    # new PID) continues its series instead of starting a new label set.
    labels = ["fleet", "agent"]
    current = GaugeMetricFamily(
        "agentscope_agent_memory_current_bytes",
        "memory.current of the agent's scope.",
        labels=labels,
    )
    peak = GaugeMetricFamily(
        "agentscope_agent_memory_peak_bytes",
        "memory.peak of the agent's scope (kernel 5.19 and later).",
        labels=labels,
    )
    kills = CounterMetricFamily(
        "agentscope_agent_oom_kills",
        "Processes of the agent the kernel OOM-killed.",
        labels=labels,
    )
    # One series per name: a row that is closing while its successor starts
    # would otherwise give the same labels twice; the later row wins.
    by_name = {str(agent.get("name")): agent for agent in agents}
    for name, agent in sorted(by_name.items()):
        values = [fleet, name]
        if agent.get("memory_current") is not None:
            current.add_metric(values, agent["memory_current"])
        if agent.get("memory_peak") is not None:
            peak.add_metric(values, agent["memory_peak"])
        kills.add_metric(values, agent.get("oom_kills") or 0)
    yield from (current, peak, kills)


def _report_families(fleet: str, report: Mapping[str, Any]) -> Iterable[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if report.get("slice_memory_current") is not None:
        slice_current = GaugeMetricFamily(
            "agentscope_slice_memory_current_bytes",
            "memory.current of the agents slice (every agent together).",
            labels=["fleet"],
        )
        slice_current.add_metric([fleet], report["slice_memory_current"])
        yield slice_current
    host = report.get("host")
    if host:
        for key, help_text in (
            ("mem_total", "MemTotal of the host."),
            ("mem_available", "MemAvailable of the host."),
        ):
            family = GaugeMetricFamily(f"agentscope_host_{key}_bytes", help_text, labels=["fleet"])
            family.add_metric([fleet], host[key])
            yield family
    ratio = GaugeMetricFamily(
        "agentscope_memory_pressure_ratio",
        "PSI memory pressure: share of time stalled over the window (0-1).",
        labels=["fleet", "source", "kind", "window"],
    )
    stall = CounterMetricFamily(
        "agentscope_memory_pressure_stall_seconds",
        "PSI memory pressure: total time stalled.",
        labels=["fleet", "source", "kind"],
    )
    for source, key in (("host", "pressure"), ("slice", "slice_pressure")):
        psi = report.get(key) or {}
        for kind in ("some", "full"):
            line = psi.get(kind)
            if not line:
                continue
            for window in _PRESSURE_WINDOWS:
                ratio.add_metric([fleet, source, kind, window[3:]], line[window] / 100)
            stall.add_metric([fleet, source, kind], line["total"] / 1e6)
    yield from (ratio, stall)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    # Applied to the socket by StreamRequestHandler.setup(): a client that
    # connects and says nothing (or trickles) is dropped after this, so it
    # holds its slot for seconds, not forever.
    timeout = 5.0

    def do_GET(self) -> None:
        if not self.server.host_allowed(self.headers.get("Host")):
            # A DNS-rebinding page reaches us with its own name in Host.
            self._send(421, "text/plain; charset=utf-8", b"misdirected request: bad Host\n")
            return
        self.server.busy(self.request)
        path = self.path.partition("?")[0]
        if path == "/metrics":
            from prometheus_client.exposition import choose_encoder

            # Accept: application/openmetrics-text gets OpenMetrics (with its
            # # EOF and _created samples), anything else the Prometheus text format.
            encode, content_type = choose_encoder(self.headers.get("Accept") or "")
            self._send(200, content_type, encode(self.server.registry))
        elif path == "/health":
            code, body = health(self.server.state)
            self._send(code, "application/json", (json.dumps(body) + "\n").encode())
        elif path == "/":
            self._send(200, "text/plain; charset=utf-8", b"agentscope monitor: /health /metrics\n")
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found: try /health or /metrics\n")

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # One journal line per scrape would drown the monitor's own events.
        pass


_MAX_CONNECTIONS = 64
"""Connections the face holds at once (each one a thread and a descriptor)."""

_LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def _host_of(header: str) -> str:
    """The host part of a Host header, lower case, without port or brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], state: FaceState, registry: Any) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.state = state
        self.registry = registry
        self._lock = threading.Lock()
        self._active = 0
        # Connections still waiting for their request, oldest first.
        self._idle: dict[socket.socket, None] = {}
        self._allowed = _LOOPBACK_HOSTS | {address[0].lower()}
        self._any_host = address[0] in _WILDCARDS
        super().__init__(address, _Handler)

    def host_allowed(self, header: str | None) -> bool:
        """Whether a request's Host names this server (absent: not a browser, allowed)."""
        if header is None or self._any_host:
            return True
        return _host_of(header) in self._allowed

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                # Out of descriptors: the listening socket stays readable, so
                # returning at once would spin the accept loop at 100% CPU.
                time.sleep(0.1)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            if self._active >= _MAX_CONNECTIONS:
                if not self._idle:
                    # Every slot is answering a request (a matter of
                    # milliseconds): this one is closed, not queued.
                    self.shutdown_request(request)
                    return
                # Full of clients that have not sent a request yet: the one
                # that has waited longest makes room, so idle connections
                # cannot starve a scrape, and neither threads nor descriptors
                # grow past the cap.
                victim = next(iter(self._idle))
                del self._idle[victim]
                with contextlib.suppress(OSError):
                    victim.shutdown(socket.SHUT_RDWR)
            self._active += 1
            self._idle[request] = None
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._done(request)
            raise

    def busy(self, request: socket.socket) -> None:
        """The request on this connection has arrived: it is no longer evictable."""
        with self._lock:
            self._idle.pop(request, None)

    def _done(self, request: Any) -> None:
        with self._lock:
            self._idle.pop(request, None)
            self._active -= 1

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that resets or times out is its own business: no traceback
        # in the journal. Anything else is still one line, not a traceback.
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            return
        print(f"agentscope monitor: HTTP request failed: {exc!r}", file=sys.stderr)


class _StateCollector:
    """Adapts :func:`metric_families` to prometheus-client's collector protocol."""

    def __init__(self, state: FaceState) -> None:
        self.state = state

    def collect(self) -> Iterable[Any]:
        return metric_families(self.state)


class HttpFace:
    """The running server; :meth:`close` stops it. Made by :func:`start_face`."""

    def __init__(self, server: _Server) -> None:
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="agentscope-http", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        """The bound host and port (the real port when 0 was asked for)."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def start_face(address: tuple[str, int], state: FaceState) -> HttpFace:
    """Bind ``address`` and serve ``/health`` and ``/metrics`` of ``state`` on a thread.

    Raises:
        Failed: prometheus-client is not installed, or the address cannot be bound.
    """
    try:
        from prometheus_client import CollectorRegistry, ProcessCollector
    except ImportError as exc:
        raise Failed(
            "--listen needs prometheus-client: pip install 'agentscope-systemd[monitor]'", "failed"
        ) from exc
    registry = CollectorRegistry(auto_describe=False)
    collector: Collector = _StateCollector(state)
    registry.register(collector)
    # The monitor's own memory and CPU, to show it is not the one eating the host.
    ProcessCollector(registry=registry)
    try:
        server = _Server(address, state, registry)
    except OSError as exc:
        raise Failed(
            f"cannot listen on {address[0]}:{address[1]}: {exc.strerror or exc}", "failed"
        ) from exc
    return HttpFace(server)
