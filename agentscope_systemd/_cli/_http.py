"""The monitor's HTTP face: ``/health`` (JSON), ``/metrics`` (Prometheus text), ``/v1/``.

Opt-in with ``agentscope monitor --listen 127.0.0.1:PORT`` (or ``--listen
unix:PATH``, a Unix socket whose file mode is the access control; see
:func:`parse_listen`). ``/v1/`` is the read API (:mod:`._readapi`). The monitor's own
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
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from agentscope_systemd import _numbers
from agentscope_systemd._contract import schema_id

from ._errors import BadInput, Failed

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from ._fleet import HistoryLike
    from ._readapi import ReadApi

__all__ = ["FaceState", "HttpFace", "health", "parse_listen", "start_face"]

#: sun_path holds 108 bytes with its terminating NUL (unix(7)).
_MAX_SOCKET_PATH = 107


def parse_listen(value: str, *, any_address: bool = False) -> tuple[str, int] | str:
    """``HOST:PORT`` (``[V6]:PORT`` for IPv6) as a (host, port) to bind; ``unix:PATH`` as PATH.

    ``localhost`` means 127.0.0.1. Without ``any_address`` the host must be a
    loopback address; with it, any address or name. Port 0 picks a free port.
    A Unix socket's PATH is absolute, at most 107 bytes; the socket is made
    mode 0600 (0660 in a set-group-ID directory: its group may connect).

    Raises:
        BadInput: not HOST:PORT, a bad port, a non-loopback address
            without ``any_address``, or a bad socket path.
    """
    if value.startswith("unix:"):
        return _socket_path(value)
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


def _socket_path(value: str) -> str:
    path = value[len("unix:") :]
    if not path.startswith("/") or "\0" in path:
        raise BadInput(f"--listen {value[:200]!r}: expected unix:/ABSOLUTE/PATH")
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        raise BadInput(
            f"--listen {value[:200]!r}: a Unix socket's path is at most {_MAX_SOCKET_PATH} bytes"
        )
    return path


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
        # Notified on every monitor event: the read API's long polls wait on it.
        self._changed = threading.Condition(self._lock)
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
            self._changed.notify_all()

    def wake(self) -> None:
        """Wake every :meth:`wait_event` now (the face is closing)."""
        with self._lock:
            self._changed.notify_all()

    def wait_event(self, timeout: float) -> None:
        """Wait for the next monitor event, :meth:`wake` or ``timeout`` seconds."""
        with self._lock:
            self._changed.wait(timeout)

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
        path, _, query = self.path.partition("?")
        if path.startswith("/v1/"):
            answer = self.server.api.answer(path, query)
            self._send(answer.status, answer.content_type, answer.body, answer.headers)
        elif path == "/metrics":
            from prometheus_client.exposition import choose_encoder

            # Accept: application/openmetrics-text gets OpenMetrics (with its
            # # EOF and _created samples), anything else the Prometheus text format.
            encode, content_type = choose_encoder(self.headers.get("Accept") or "")
            self._send(200, content_type, encode(self.server.registry))
        elif path == "/health":
            code, body = health(self.server.state)
            self._send(code, "application/json", (json.dumps(body) + "\n").encode())
        elif path == "/":
            self._send(200, "text/plain; charset=utf-8", _ROUTES + b"\n")
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found: try " + _ROUTES + b"\n")

    def _send(
        self, code: int, content_type: str, body: bytes, headers: Iterable[tuple[str, str]] = ()
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # One journal line per scrape would drown the monitor's own events.
        pass


_ROUTES = b"agentscope monitor: /health /metrics /v1/agents /v1/agents/NAME /v1/events /v1/report"

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

    def __init__(
        self, address: tuple[str, int] | str, state: FaceState, registry: Any, api: ReadApi
    ) -> None:
        self.state = state
        self.registry = registry
        self.api = api
        self._lock = threading.Lock()
        self._active = 0
        # Connections still waiting for their request, oldest first.
        self._idle: dict[socket.socket, None] = {}
        self._socket_inode: tuple[int, int] | None = None
        if isinstance(address, str):
            self.address_family = socket.AF_UNIX
            # No browser reaches a Unix socket (DNS rebinding needs TCP): the
            # socket's file mode is the access control, any Host is fine.
            self._allowed: frozenset[str] = frozenset()
            self._any_host = True
        else:
            self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
            self._allowed = _LOOPBACK_HOSTS | {address[0].lower()}
            self._any_host = address[0] in _WILDCARDS
        super().__init__(address, _Handler)  # type: ignore[arg-type]

    def server_bind(self) -> None:
        if self.address_family != socket.AF_UNIX:
            super().server_bind()
            return
        path = str(self.server_address)
        _clear_stale_socket(path)
        self.socket.bind(path)
        # Before listen(): no client can connect while the mode is still the
        # umask's. 0600; in a set-group-ID directory 0660, its group's members
        # may connect (the directory's owner chose that group).
        parent = os.stat(os.path.dirname(path) or "/")
        os.chmod(path, 0o660 if parent.st_mode & stat.S_ISGID else 0o600)
        st = os.lstat(path)
        self._socket_inode = (st.st_dev, st.st_ino)
        self.server_name, self.server_port = "localhost", 0

    def remove_socket(self) -> None:
        """Remove the Unix socket's file, if it is still ours."""
        if self._socket_inode is None:
            return
        path = str(self.server_address)
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            if (st.st_dev, st.st_ino) == self._socket_inode:
                os.unlink(path)

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


def _clear_stale_socket(path: str) -> None:
    """Remove a socket a stopped monitor left at ``path``; refuse anything else there.

    Raises:
        OSError: ``path`` is not a socket (EEXIST), or a monitor listens on it (EADDRINUSE).
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(errno.EEXIST, "the path exists and is not a socket; remove it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)  # nobody listens: a stopped monitor's
            return
        except OSError:
            pass
    raise OSError(errno.EADDRINUSE, "another process listens on it")


class HttpFace:
    """The running server; :meth:`close` stops it. Made by :func:`start_face`."""

    def __init__(self, server: _Server) -> None:
        self._server = server
        self._closed = False
        self._thread = threading.Thread(
            target=server.serve_forever, name="agentscope-http", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> tuple[str, int] | str:
        """The bound host and port (the real port when 0 was asked for); a Unix socket's path."""
        bound = self._server.server_address
        if isinstance(bound, str | bytes):
            return os.fsdecode(bound)
        host, port = bound[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        """``http://HOST:PORT``, or ``unix:PATH``."""
        address = self.address
        if isinstance(address, str):
            return f"unix:{address}"
        host, port = address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def close(self) -> None:
        """Stop serving, end the long polls, remove a Unix socket; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._server.api.close()  # ends the long polls: shutdown waits for none of them
        self._server.shutdown()
        self._server.server_close()
        self._server.remove_socket()
        self._thread.join(5)


def start_face(
    address: tuple[str, int] | str, state: FaceState, history: HistoryLike | None = None
) -> HttpFace:
    """Bind ``address`` and serve ``/health``, ``/metrics`` and ``/v1/`` of ``state`` on a thread.

    ``address`` is (host, port) or a Unix socket's path (:func:`parse_listen`).
    ``history``, the fleet's recorded events (the monitor's own fleet,
    borrowed: close the face first), serves ``/v1/events``; without it that
    route is 404.

    Raises:
        Failed: prometheus-client is not installed, or the address cannot be bound.
    """
    from ._readapi import ReadApi

    try:
        from prometheus_client import CollectorRegistry, ProcessCollector
    except ImportError as exc:
        raise Failed(
            "--listen needs prometheus-client: pip install 'agentscope-systemd[monitor]'", "failed"
        ) from exc
    registry = CollectorRegistry(auto_describe=False)
    from ._metrics import StateCollector

    collector: Collector = StateCollector(state)
    registry.register(collector)
    # The monitor's own memory and CPU, to show it is not the one eating the host.
    ProcessCollector(registry=registry)
    api = ReadApi(state, history)
    try:
        server = _Server(address, state, registry, api)
    except OSError as exc:
        where = address if isinstance(address, str) else f"{address[0]}:{address[1]}"
        raise Failed(f"cannot listen on {where}: {exc.strerror or exc}", "failed") from exc
    return HttpFace(server)
