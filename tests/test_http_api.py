"""The monitor face's read API (/v1/): the CLI's --json shapes, its bounds, its Unix socket.

The face serves a real ``agentscope_systemd.Fleet`` on the fake systemd manager and
cgroup tree (tests/test_contract.py's ``real`` fixture), sampled as the
monitor samples it, and the fleet's real registry file: each body is
compared with what the CLI prints for the same fleet, and validated against
``schemas/`` (strictly: no field the schema does not name).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentscope_systemd._cli import _fleet, _readapi
from agentscope_systemd._cli._cmd_monitor import _sample
from agentscope_systemd._cli._errors import BadInput, Failed
from agentscope_systemd._cli._http import FaceState, HttpFace, parse_listen, start_face
from agentscope_systemd._cli._options import Options
from agentscope_systemd._contract import stamped
from tests.fakesystemd import FakeSystemd
from tests.test_contract import json_lines, json_of, real, validate

__all__ = ["real"]  # the fixture, used by name below


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def get(
    face: HttpFace, path: str, *, host: str | None = None, timeout: float = 20
) -> tuple[int, dict[str, str], str]:
    """GET ``path``: status, headers (lower-case names), body."""
    address = face.address
    conn: http.client.HTTPConnection
    if isinstance(address, str):
        conn = _UnixConnection(address, timeout)
    else:
        conn = http.client.HTTPConnection(address[0], address[1], timeout=timeout)
    try:
        conn.putrequest("GET", path, skip_host=host is not None)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        response = conn.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return response.status, headers, response.read().decode()
    finally:
        conn.close()


def lines(body: str) -> list[Any]:
    return [json.loads(line) for line in body.splitlines()]


@pytest.fixture
def served(real: FakeSystemd, tmp_path: Path) -> Iterator[tuple[HttpFace, FaceState, Any]]:
    """A face over the fleet ``default`` (two agents, a and b), sampled once; and the fleet."""
    assert json_of("run", "a", "--", "sleep", "30")["name"] == "a"
    assert json_of("run", "b", "--", "sleep", "30")["name"] == "b"
    fleet = _fleet.open_fleet(Options(manager="user"))
    state = FaceState("default", "user", period=2.0, version="1.0")
    face = start_face(("127.0.0.1", 0), state, fleet)  # as the monitor does
    try:
        yield face, state, fleet
    finally:
        face.close()
        fleet.close()


def test_agents_and_one_agent_are_what_ls_json_prints(
    served: tuple[HttpFace, FaceState, Any],
) -> None:
    face, state, fleet = served
    _sample(fleet, state)  # what the monitor does every --interval
    listed = json_of("ls")
    code, headers, body = get(face, "/v1/agents")
    assert (code, headers["content-type"]) == (200, "application/json")
    assert json.loads(body) == listed
    assert [validate(a) for a in json.loads(body)] == ["agentscope.agent/1"] * 2
    code, _, body = get(face, "/v1/agents/b")
    assert code == 200
    assert json.loads(body) == next(a for a in listed if a["name"] == "b")
    validate(json.loads(body))


def test_report_is_report_json_of_the_last_sample(
    served: tuple[HttpFace, FaceState, Any],
) -> None:
    face, state, fleet = served
    _sample(fleet, state)
    code, _, body = get(face, "/v1/report")
    report = json.loads(body)
    assert code == 200
    assert validate(report) == "agentscope.report/1"
    sample, _ = state.read()
    assert sample is not None
    assert report == stamped("report", sample.report or {})
    assert {a["agent"] for a in report["agents"]} == {"a", "b"}
    # The CLI's report of the same fleet has the same agents.
    assert {a["agent"] for a in json_of("report", "--top", "0")["agents"]} == {"a", "b"}


def test_events_are_what_events_json_prints_and_page_by_id(
    served: tuple[HttpFace, FaceState, Any],
) -> None:
    face, _, _ = served
    json_of("kill", "a", "--signal", "CONT")
    printed = json_lines("events")
    assert [e["kind"] for e in printed] == ["launched", "launched", "signalled"]
    code, headers, body = get(face, "/v1/events")
    assert (code, headers["content-type"]) == (200, "application/x-ndjson")
    assert lines(body) == printed
    assert {validate(e) for e in lines(body)} == {"agentscope.event/1"}
    first = printed[0]["id"]
    assert lines(get(face, f"/v1/events?after={first}&limit=1")[2]) == printed[1:2]
    assert lines(get(face, f"/v1/events?after={printed[-1]['id']}")[2]) == []
    assert lines(get(face, "/v1/events?limit=1")[2]) == printed[-1:]  # the newest, as --limit
    assert lines(get(face, "/v1/events?agent=a")[2]) == json_lines("events", "--agent", "a")
    assert lines(get(face, "/v1/events?kind=signalled&after=0")[2]) == printed[-1:]


def test_a_long_poll_returns_as_soon_as_an_event_is_recorded(
    served: tuple[HttpFace, FaceState, Any],
) -> None:
    face, _, _ = served
    last = json_lines("events")[-1]["id"]
    # Written by another process's registry connection (a CLI's kill): the
    # face hears nothing of it and must find it in the file.
    timer = threading.Timer(0.5, lambda: json_of("kill", "b", "--signal", "CONT"))
    timer.start()
    t0 = time.monotonic()
    code, _, body = get(face, f"/v1/events?after={last}&wait=20")
    took = time.monotonic() - t0
    timer.join()
    assert code == 200
    assert [(e["kind"], e["agent"]) for e in lines(body)] == [("signalled", "b")]
    assert 0.4 < took < 5, took
    # Nothing comes: the poll ends empty once its wait is over.
    last = lines(body)[-1]["id"]
    t0 = time.monotonic()
    assert get(face, f"/v1/events?after={last}&wait=0.6")[:1] == (200,)
    assert 0.5 < time.monotonic() - t0 < 5


def test_a_monitor_event_wakes_the_waiting_long_polls() -> None:
    # The monitor's own events need no registry poll to be seen by a waiter.
    state = FaceState("default", "user", period=2.0)
    woke: list[float] = []
    waiter = threading.Thread(target=lambda: (state.wait_event(30), woke.append(time.monotonic())))
    waiter.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    state.event({"kind": "oom_kill", "ts": 1.0, "agent": "a"})
    waiter.join(10)
    assert woke
    assert woke[0] - t0 < 2


def test_long_polls_are_bounded_and_end_when_the_face_closes(
    served: tuple[HttpFace, FaceState, Any],
) -> None:
    face, state, fleet = served
    _sample(fleet, state)
    last = json_lines("events")[-1]["id"]
    results: list[int] = []
    pollers = [
        threading.Thread(
            target=lambda: results.append(get(face, f"/v1/events?after={last}&wait=60")[0])
        )
        for _ in range(_readapi.MAX_LONG_POLLS)
    ]
    for p in pollers:
        p.start()
    time.sleep(1.0)  # every one of them waits now
    code, headers, body = get(face, f"/v1/events?after={last}&wait=60")
    assert (code, headers.get("retry-after")) == (429, "1")
    assert json.loads(body)["kind"] == "busy"
    validate(json.loads(body))
    # A poll that does not wait, a scrape and the rest of the API still answer.
    t0 = time.monotonic()
    assert get(face, f"/v1/events?after={last}")[0] == 200
    assert get(face, "/v1/agents")[0] == 200
    assert get(face, "/health")[0] in (200, 503)
    assert time.monotonic() - t0 < 3
    t0 = time.monotonic()
    face.close()
    for p in pollers:
        p.join(10)
    assert time.monotonic() - t0 < 5
    assert results == [200] * _readapi.MAX_LONG_POLLS


def test_before_the_first_sample_the_api_says_starting(
    served: tuple[HttpFace, FaceState, Any],
) -> None:
    face, _, _ = served
    for path in ("/v1/agents", "/v1/agents/a", "/v1/report"):
        code, headers, body = get(face, path)
        assert (code, headers.get("retry-after")) == (503, "1"), path
        assert json.loads(body)["kind"] == "starting"
        validate(json.loads(body))
    assert get(face, "/v1/events")[0] == 200  # the registry needs no sample


@pytest.mark.parametrize(
    ("path", "status", "kind"),
    [
        ("/v1/agents/nosuch", 404, "not_found"),
        ("/v1/agents/.hidden", 400, "invalid_name"),
        ("/v1/agents/" + "x" * 65, 400, "invalid_name"),
        ("/v1/agents/a%2Fb", 400, "invalid_name"),
        ("/v1/agents/a/b", 400, "invalid_name"),
        ("/v1/agents?x=1", 400, "bad_input"),
        ("/v1/report?top=3", 400, "bad_input"),
        ("/v1/events?after=-1", 400, "invalid_config"),
        ("/v1/events?after=x", 400, "invalid_config"),
        ("/v1/events?after=1e3", 400, "invalid_config"),
        ("/v1/events?after=%C2%B2", 400, "invalid_config"),  # a superscript two
        ("/v1/events?after=" + "9" * 20, 400, "invalid_config"),
        ("/v1/events?limit=0", 400, "invalid_config"),
        ("/v1/events?limit=1001", 400, "invalid_config"),
        ("/v1/events?wait=61", 400, "invalid_config"),
        ("/v1/events?wait=nan", 400, "invalid_config"),
        ("/v1/events?wait=inf", 400, "invalid_config"),
        ("/v1/events?wait=-1", 400, "invalid_config"),
        ("/v1/events?afterr=1", 400, "bad_input"),
        ("/v1/events?after=1&after=2", 400, "bad_input"),
        ("/v1/events?after", 400, "bad_input"),
        ("/v1/events?after=", 400, "invalid_config"),
        ("/v1/events?&&", 400, "bad_input"),
        ("/v1/events?agent=..", 400, "invalid_name"),
        ("/v1/events?kind=OOM", 400, "bad_input"),
        ("/v1/events?kind=oom%00kill", 400, "bad_input"),
        ("/v1/events?kind=" + "a" * 65, 400, "bad_input"),
        ("/v1/events?kind=%FF", 400, "bad_input"),
        ("/v1/events?" + "a=1&" * 400, 400, "bad_input"),
        ("/v1/nothing", 404, "not_found"),
        ("/v1/", 404, "not_found"),
    ],
)
def test_bad_parameters_are_refused_with_the_contract_s_error(
    served: tuple[HttpFace, FaceState, Any], path: str, status: int, kind: str
) -> None:
    face, state, fleet = served
    _sample(fleet, state)
    code, headers, body = get(face, path)
    assert (code, headers["content-type"]) == (status, "application/json"), body
    error = json.loads(body)
    assert error["kind"] == kind, error
    assert validate(error) == "agentscope.error/1"


def test_the_host_check_holds_for_the_read_api(served: tuple[HttpFace, FaceState, Any]) -> None:
    face, state, fleet = served
    _sample(fleet, state)
    assert get(face, "/v1/agents", host="evil.example")[0] == 421
    assert get(face, "/v1/events?wait=5", host="evil.example:80")[0] == 421
    assert get(face, "/v1/agents", host="localhost")[0] == 200


# -- the Unix socket ----------------------------------------------------------------


def test_listen_takes_an_absolute_unix_socket_path() -> None:
    assert parse_listen("unix:/run/agentscope/monitor.sock") == "/run/agentscope/monitor.sock"
    for bad in ("unix:", "unix:monitor.sock", "unix:/a\0b", "unix:/" + "x" * 107):
        with pytest.raises(BadInput, match="--listen"):
            parse_listen(bad)


def test_a_unix_socket_is_its_owner_s_alone_and_goes_with_the_face(tmp_path: Path) -> None:
    path = str(tmp_path / "monitor.sock")
    face = start_face(path, FaceState("default", "user", period=2.0))
    try:
        assert face.url == f"unix:{path}"
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert get(face, "/health")[0] == 503  # starting: served
    finally:
        face.close()
    assert not os.path.exists(path)  # the monitor cleans up after itself


def test_a_unix_socket_serves_the_read_api(
    served: tuple[HttpFace, FaceState, Any], tmp_path: Path
) -> None:
    tcp, state, fleet = served
    _sample(fleet, state)
    path = str(tmp_path / "api.sock")
    face = start_face(path, state, fleet)
    try:
        for route in ("/v1/agents", "/v1/agents/a", "/v1/report", "/v1/events"):
            code, _, body = get(face, route, host="anything.example")
            assert code == 200, route
            assert body == get(tcp, route)[2], route
    finally:
        face.close()


def test_a_unix_socket_in_a_setgid_directory_admits_its_group(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o2770)
    if not os.stat(shared).st_mode & stat.S_ISGID:
        pytest.skip("this file system does not keep the set-group-ID bit")
    face = start_face(str(shared / "monitor.sock"), FaceState("default", "user", period=2.0))
    try:
        assert stat.S_IMODE(os.stat(shared / "monitor.sock").st_mode) == 0o660
    finally:
        face.close()


def test_a_stale_socket_is_replaced_and_anything_else_is_refused(tmp_path: Path) -> None:
    state = FaceState("default", "user", period=2.0)
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as old:
        old.bind(str(stale))  # bound, never listening: a monitor that was killed
    face = start_face(str(stale), state)
    try:
        assert get(face, "/health")[0] == 503
        with pytest.raises(Failed, match="another process listens"):
            start_face(str(stale), state)  # a live monitor's socket is left alone
    finally:
        face.close()
    regular = tmp_path / "notes.txt"
    regular.write_text("mine\n")
    with pytest.raises(Failed, match="not a socket"):
        start_face(str(regular), state)
    assert regular.read_text() == "mine\n"
