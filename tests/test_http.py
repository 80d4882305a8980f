"""The monitor's HTTP face: address rules, /health states, /metrics as Prometheus parses it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentscope_systemd._cli._errors import BadInput
from agentscope_systemd._cli._http import FaceState, HttpFace, health, parse_listen, start_face
from agentscope_systemd._cli._notify import Notifier

AGENTS = [
    {
        "name": "builder",
        "unit": "agentscope-default-builder-a1b2c3.scope",
        "state": "running",
        "memory_current": 3 << 20,
        "memory_peak": 5 << 20,
        "oom_kills": 2,
        "calls": 3,
    },
    {
        "name": "idle",
        "unit": "agentscope-default-idle-d4e5f6.scope",
        "state": "frozen",
        "memory_current": None,
        "memory_peak": None,
        "oom_kills": 0,
    },
]
PSI = {"avg10": 12.5, "avg60": 3.0, "avg300": 0.5, "total": 2_500_000}
REPORT = {
    "host": {"mem_total": 8 << 30, "mem_available": 2 << 30, "swap_total": 0, "swap_free": 0},
    "pressure": {"some": PSI, "full": {**PSI, "avg10": 1.0}},
    "slice_pressure": {"some": PSI, "full": None},
    "slice_memory_current": 3 << 20,
}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("localhost:0", ("127.0.0.1", 0)),
        ("127.1.2.3:80", ("127.1.2.3", 80)),
        ("[::1]:9464", ("::1", 9464)),
    ],
)
def test_loopback_addresses_are_accepted(value: str, expected: tuple[str, int]) -> None:
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["0.0.0.0:9464", "[::]:9464", "10.1.2.3:9464", "host:9464"])
def test_other_addresses_need_listen_any(value: str) -> None:
    with pytest.raises(BadInput, match="--listen-any"):
        parse_listen(value)
    host, port = parse_listen(value, any_address=True)
    assert port == 9464
    assert host in value


@pytest.mark.parametrize("value", ["9464", ":9464", "127.0.0.1:", "127.0.0.1:x", "127.0.0.1:70000"])
def test_malformed_listen_values(value: str) -> None:
    with pytest.raises(BadInput, match="--listen"):
        parse_listen(value)


def test_health_states() -> None:
    state = FaceState("default", "system", period=2.0, version="1.0")
    code, body = health(state, now=1000.0)
    assert (code, body["status"]) == (503, "starting")
    state.sampled(AGENTS, REPORT, "fleet default: 2 agents", now=1000.0)
    code, body = health(state, now=1001.0)
    assert (code, body["status"]) == (200, "ok")
    assert body["agents"] == 2
    assert body["agents_by_state"] == {"frozen": 1, "running": 1}
    assert body["last_report"] == {
        "status": "fleet default: 2 agents",
        "memory_current": 3 << 20,
        "oom_kills": 2,
        "slice_memory_current": 3 << 20,
        "host_mem_available": 2 << 30,
        "host_pressure_some_avg10": 12.5,
    }
    # Three periods, at least 10 s, without a sample: stale.
    assert health(state, now=1009.0)[1]["status"] == "ok"
    assert health(state, now=1011.0) == (503, health(state, now=1011.0)[1])
    assert health(state, now=1011.0)[1]["status"] == "stale"
    state.failed(OSError(5, "Input/output error"), now=1002.0)
    code, body = health(state, now=1002.5)
    assert (code, body["status"]) == (503, "error")
    assert "Input/output error" in body["last_error"]
    state.sampled(AGENTS, REPORT, "fleet default: 2 agents", now=1003.0)
    code, body = health(state, now=1003.5)
    assert (code, body["status"], body["sample_errors"], body["samples"]) == (200, "ok", 1, 2)
    json.dumps(body)  # JSON-ready


def test_an_oom_watch_whose_samples_keep_failing_is_not_healthy() -> None:
    state = FaceState("default", "user", period=2.0)
    state.sampled(AGENTS, REPORT, "fleet default: 2 agents", now=1000.0)
    state.watch(2, 2)
    assert health(state, now=1000.5)[1]["status"] == "ok"  # two in a row: not yet
    state.watch(3, 3)
    code, body = health(state, now=1000.5)
    assert (code, body["status"], body["watch_failures_in_a_row"]) == (503, "error", 3)
    state.watch(3, 0)  # a good sample again
    code, body = health(state, now=1000.5)
    assert (code, body["status"], body["watch_sample_failures"]) == (200, "ok", 3)


@pytest.fixture
def face() -> Iterator[tuple[HttpFace, FaceState]]:
    state = FaceState("default", "user", period=2.0, version="1.0")
    server = start_face(("127.0.0.1", 0), state)
    try:
        yield server, state
    finally:
        server.close()


def get(face: HttpFace, path: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(face.url + path, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(family: Any) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


def test_metrics_parse_and_carry_the_sample(face: tuple[HttpFace, FaceState]) -> None:
    server, state = face
    code, ctype, text = get(server, "/metrics")
    assert code == 200
    assert ctype.startswith("text/plain; version=")
    assert "agentscope_monitor_info" in families(text)  # before the first sample too
    state.sampled(AGENTS, REPORT, "fleet default: 2 agents")
    state.event({"kind": "oom_kill", "ts": 1.0, "agent": "builder"})
    state.failed("cannot read memory.events")
    got = families(get(server, "/metrics")[2])
    builder = (("agent", "builder"), ("fleet", "default"))
    idle = (("agent", "idle"), ("fleet", "default"))
    assert samples(got["agentscope_agent_memory_current_bytes"]) == {builder: 3 << 20}
    assert samples(got["agentscope_agent_oom_kills"]) == {builder: 2, idle: 0}
    assert got["agentscope_agent_oom_kills"].type == "counter"
    assert samples(got["agentscope_agent_calls"]) == {builder: 3, idle: 0}
    states = samples(got["agentscope_agents"])
    assert states[(("fleet", "default"), ("state", "running"))] == 1
    assert states[(("fleet", "default"), ("state", "frozen"))] == 1
    assert samples(got["agentscope_monitor_sample_errors"]) == {(("fleet", "default"),): 1}
    assert samples(got["agentscope_monitor_watch_sample_failures"]) == {(("fleet", "default"),): 0}
    events = samples(got["agentscope_monitor_events"])
    assert events[(("fleet", "default"), ("kind", "oom_kill"))] == 1
    assert events[(("fleet", "default"), ("kind", "guard_kill"))] == 0
    pressure = samples(got["agentscope_memory_pressure_ratio"])
    key = (("fleet", "default"), ("kind", "some"), ("source", "host"), ("window", "10"))
    assert pressure[key] == pytest.approx(0.125)
    assert len(pressure) == 3 * 3  # host some+full, slice some
    stall = samples(got["agentscope_memory_pressure_stall_seconds"])
    assert stall[(("fleet", "default"), ("kind", "some"), ("source", "slice"))] == 2.5
    assert samples(got["agentscope_host_mem_available_bytes"]) == {(("fleet", "default"),): 2 << 30}
    assert "process_resident_memory_bytes" in got  # the monitor's own memory


def test_every_event_kind_counts_from_zero_before_its_first_event(
    face: tuple[HttpFace, FaceState],
) -> None:
    # A counter series born at 1 hides its first event from increase() and
    # rate(): the dashboard's "OOM kills (1h)" would show 0 after one kill.
    server, state = face
    before = samples(families(get(server, "/metrics")[2])["agentscope_monitor_events"])
    kinds = {dict(labels)["kind"] for labels in before}
    assert {"oom_kill", "guard_kill", "throttled", "pressure", "limit_found"} <= kinds
    assert set(before.values()) == {0}
    state.event({"kind": "oom_kill", "ts": 1.0, "agent": "builder"})
    after = samples(families(get(server, "/metrics")[2])["agentscope_monitor_events"])
    assert after[(("fleet", "default"), ("kind", "oom_kill"))] == 1
    assert set(after) == set(before)


def test_a_relaunched_agent_keeps_its_series(face: tuple[HttpFace, FaceState]) -> None:
    # Prometheus keeps every label set it ever saw: a unit name or a PID in
    # the labels would start new series at every relaunch of an agent.
    server, state = face
    state.sampled(AGENTS, REPORT, "before")
    before = families(get(server, "/metrics")[2])
    relaunched = {**AGENTS[0], "unit": "agentscope-default-builder-0f0f0f.scope", "pid": 999}
    # A listing can hold the closing row and its successor at once: one series still.
    state.sampled([AGENTS[0], relaunched, AGENTS[1]], REPORT, "after")
    after = families(get(server, "/metrics")[2])
    for name in (
        "agentscope_agent_memory_current_bytes",
        "agentscope_agent_memory_peak_bytes",
        "agentscope_agent_oom_kills",
        "agentscope_agent_calls",
    ):
        assert set(samples(after[name])) == set(samples(before[name])), name
        for labels in samples(after[name]):
            assert {k for k, _ in labels} == {"fleet", "agent"}, name


def test_openmetrics_is_served_to_a_client_that_asks_for_it(
    face: tuple[HttpFace, FaceState],
) -> None:
    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families as openmetrics_families,
    )

    server, state = face
    state.sampled(AGENTS, REPORT, "fleet default: 2 agents")
    state.event({"kind": "guard_kill", "ts": 1.0, "agent": "builder", "pid": 7})
    request = urllib.request.Request(
        server.url + "/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0,text/plain;q=0.5"},
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        ctype, text = r.headers["Content-Type"], r.read().decode()
    assert ctype.startswith("application/openmetrics-text; version=1.0.0")
    assert text.endswith("# EOF\n")
    got = {f.name: f for f in openmetrics_families(text)}  # the strict parser: it raises on errors
    assert got["agentscope_guard_kills"].type == "counter"
    assert samples(got["agentscope_guard_kills"]) == {(("fleet", "default"),): 1}
    # Without the Accept header: the Prometheus text format, as before.
    code, plain_type, plain = get(server, "/metrics")
    assert code == 200
    assert plain_type.startswith("text/plain; version=0.0.4")
    assert "# EOF" not in plain


def test_metrics_count_guard_kills_and_show_the_guard(face: tuple[HttpFace, FaceState]) -> None:
    server, state = face
    text = get(server, "/metrics")[2]
    assert "agentscope_guard_kills_total 0" not in text  # labelled by fleet
    assert samples(families(text)["agentscope_guard_kills"]) == {(("fleet", "default"),): 0}
    assert "agentscope_guard_running" not in families(text)  # started without a guard
    running = [True]
    state.guard = lambda: running[0]
    state.event({"kind": "guard_kill", "ts": 1.0, "agent": "builder", "pid": 7})
    state.event({"kind": "guard_kill", "ts": 2.0, "agent": "builder", "pid": 8})
    text = get(server, "/metrics")[2]
    assert 'agentscope_guard_kills_total{fleet="default"} 2.0' in text
    assert samples(families(text)["agentscope_guard_running"]) == {(("fleet", "default"),): 1}
    running[0] = False
    got = families(get(server, "/metrics")[2])
    assert samples(got["agentscope_guard_running"]) == {(("fleet", "default"),): 0}


def test_health_and_unknown_paths(face: tuple[HttpFace, FaceState]) -> None:
    server, state = face
    code, ctype, body = get(server, "/health")
    assert (code, ctype, json.loads(body)["status"]) == (503, "application/json", "starting")
    state.sampled(AGENTS, REPORT, "fleet default: 2 agents")
    code, _, body = get(server, "/health?verbose=1")
    assert (code, json.loads(body)["status"]) == (200, "ok")
    assert get(server, "/nope")[0] == 404


def test_a_silent_client_does_not_hold_up_others(face: tuple[HttpFace, FaceState]) -> None:
    server, _ = face
    with socket.create_connection(server.address) as silent:
        silent.sendall(b"GET /metr")  # and never finishes the request
        t0 = time.monotonic()
        assert get(server, "/metrics")[0] == 200
        assert time.monotonic() - t0 < 5


def test_a_taken_port_is_a_clear_failure(face: tuple[HttpFace, FaceState]) -> None:
    server, state = face
    from agentscope_systemd._cli._errors import Failed

    with pytest.raises(Failed, match=r"cannot listen on 127\.0\.0\.1"):
        start_face(server.address, state)


def test_monitor_refuses_a_public_address_before_connecting() -> None:
    argv = ["--json", "monitor", "--listen", "0.0.0.0:9464"]
    done = subprocess.run(
        [sys.executable, "-c", "from agentscope_systemd._cli.main import main; main()", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    error = json.loads(done.stderr)
    assert error["kind"] == "bad_input"
    assert "--listen-any" in error["error"]


def test_watchdog_interval_from_the_manager() -> None:
    import os

    assert Notifier({"WATCHDOG_USEC": "4000000"}).watchdog == 4.0
    assert Notifier({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}).watchdog == 4
    assert Notifier({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}).watchdog is None
    assert Notifier({"WATCHDOG_USEC": "0"}).watchdog is None
    assert Notifier({}).watchdog is None


def test_idle_connections_past_the_cap_neither_pile_up_nor_starve_a_scrape(
    face: tuple[HttpFace, FaceState],
) -> None:
    import threading

    from agentscope_systemd._cli import _http

    server, _ = face
    idle = [socket.create_connection(server.address) for _ in range(3 * _http._MAX_CONNECTIONS)]
    try:
        for conn in idle:
            conn.sendall(b"GET /metr")
        t0 = time.monotonic()
        assert get(server, "/metrics")[0] == 200
        assert time.monotonic() - t0 < 2
        # The server closed all but (at most) a cap's worth: they read EOF.
        deadline = time.monotonic() + 5
        closed = 0
        for conn in idle:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                closed += conn.recv(1) == b""
            except (TimeoutError, ConnectionResetError):
                closed += isinstance(sys.exc_info()[1], ConnectionResetError)
        assert closed >= len(idle) - _http._MAX_CONNECTIONS
        handlers = [t for t in threading.enumerate() if t.name.startswith("Thread-")]
        assert len(handlers) <= _http._MAX_CONNECTIONS + 1
    finally:
        for conn in idle:
            conn.close()


def test_a_silent_client_is_dropped_after_the_timeout(
    face: tuple[HttpFace, FaceState], monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentscope_systemd._cli import _http

    monkeypatch.setattr(_http._Handler, "timeout", 0.3)
    server, _ = face
    with socket.create_connection(server.address) as silent:
        silent.settimeout(5)
        t0 = time.monotonic()
        assert silent.recv(100) == b""
        assert time.monotonic() - t0 < 3


def test_a_reset_connection_prints_no_traceback(
    face: tuple[HttpFace, FaceState], capfd: pytest.CaptureFixture[str]
) -> None:
    import struct

    server, _ = face
    for _ in range(5):
        conn = socket.create_connection(server.address)
        conn.sendall(b"GET /metr")
        time.sleep(0.05)
        # SO_LINGER 0: close sends RST while the server reads the request.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
    assert get(server, "/health")[0] == 503
    time.sleep(0.2)
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize(
    ("host", "code"),
    [
        ("evil.example", 421),
        ("evil.example:9464", 421),
        ("127.0.0.1.nip.io", 421),
        ("localhost", 503),
        ("LOCALHOST:9464", 503),
        ("127.0.0.1:1", 503),
        ("[::1]:9464", 503),
    ],
)
def test_the_host_header_must_name_this_host(
    face: tuple[HttpFace, FaceState], host: str, code: int
) -> None:
    server, _ = face
    request = urllib.request.Request(server.url + "/health", headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            got = r.status
    except urllib.error.HTTPError as exc:
        got = exc.code
    assert got == code


_FACE_WITH_FEW_FDS = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (24, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from agentscope_systemd._cli._http import FaceState, start_face
server = start_face(("127.0.0.1", 0), FaceState("default", "user", period=2.0, version="1.0"))
print(server.address[1], flush=True)
time.sleep(60)
"""


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_face_out_of_descriptors_does_not_spin() -> None:
    # More idle clients than the face has descriptors (a local user can open
    # them): accept() fails with EMFILE while the listening socket stays
    # readable. The face must wait, not spin its accept loop at 100% CPU.
    proc = subprocess.Popen(
        [sys.executable, "-c", _FACE_WITH_FEW_FDS],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    clients: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        for _ in range(40):
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)  # the face has taken what it can; the rest wait in its backlog
        before, t0 = _cpu_seconds(proc.pid), time.monotonic()
        time.sleep(2.0)
        used = (_cpu_seconds(proc.pid) - before) / (time.monotonic() - t0)
        assert used < 0.1, f"the face used {used:.0%} of a core while out of descriptors"
        for c in clients:
            c.close()
        clients.clear()
        # Once the clients are gone it serves again.
        deadline = time.monotonic() + 10
        status = None
        while status is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    status = r.status
            except urllib.error.HTTPError as exc:  # an answer: 503 before any sample
                status = exc.code
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert status in (200, 503)
    finally:
        for c in clients:
            c.close()
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
