"""The exec path's D-Bus wire format, checked against dbus-fast's in both directions."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from dbus_fast import Message, MessageType, Variant
from dbus_fast._private.unmarshaller import Unmarshaller
from hypothesis import given, settings
from hypothesis import strategies as st

from agentscope_systemd import SystemdTimeout, SystemdUnavailable
from agentscope_systemd._managers import _scope, _scopeprops, _wire

# The StartTransientUnit call of an exec, every property type it sends.
PROPS = {
    **_scope.scope_properties(
        "fleet", "agent", "app-agentscope-agents.slice", _scopeprops.build(memory_max=2**30)
    ),
    "PIDs": ("au", [1234, 99]),
    "OOMPolicy": ("s", "continue"),
}
START = ["agentscope-fleet-agent-abc123.scope", "fail", list(PROPS.items()), []]


class Server:
    """A unix socket that answers the EXTERNAL handshake, then records what it gets."""

    def __init__(self, path: str) -> None:
        self.address = f"unix:path={path}"
        self.auth = b""
        self.data = b""
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(path)
        self._listener.listen()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        with conn:
            while not self.auth.endswith(b"BEGIN\r\n"):
                self.auth += conn.recv(4096)
            conn.sendall(b"OK 0123456789abcdef0123456789abcdef\r\n")
            while chunk := conn.recv(4096):
                self.data += chunk

    def received(self) -> bytes:
        """All it got after the handshake, once the client has closed."""
        self._thread.join(5)
        return self.data

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def server(tmp_path: Any) -> Iterator[Server]:
    srv = Server(str(tmp_path / "s"))
    yield srv
    srv.close()


def _dbus_fast_message(data: bytes) -> Message:
    msg = Unmarshaller(io.BufferedRWPair(io.BytesIO(data), io.BytesIO())).unmarshall()
    assert msg is not None
    return msg


def test_a_start_call_reads_back_in_dbus_fast(server: Server) -> None:
    conn = _wire.Connection("user", server.address, direct=False, timeout=5)
    serial = conn.send("StartTransientUnit", "ssa(sv)a(sa(sv))", START)
    conn.close()
    sent = server.received()
    msg = _dbus_fast_message(sent)
    assert serial == msg.serial == 1
    assert (msg.destination, msg.path, msg.interface, msg.member) == (
        _wire.SD,
        _wire.SD_PATH,
        _wire.SD_MANAGER,
        "StartTransientUnit",
    )
    unit, mode, props, aux = msg.body
    assert (unit, mode, aux) == (START[0], "fail", [])
    assert {k: (v.signature, v.value) for k, v in props} == PROPS


def test_dbus_fast_bodies_read_back_here() -> None:
    body = [
        "s\u00e9",
        [["PIDs", Variant("au", [1, 2**32 - 1])], ["X", Variant("t", 2**64 - 1)]],
        {"a": Variant("b", True), "b": Variant("as", ["x", ""])},
        [7, "/org/x", "g(ii)"],
    ]
    sig = "sa(sv)a{sv}(uog)"
    data = bytes(Message(path="/p", member="M", signature=sig, body=body)._marshall(False))
    msg = _wire._Message(data)
    assert msg.body == [
        "s\u00e9",
        [["PIDs", [1, 2**32 - 1]], ["X", 2**64 - 1]],
        {"a": True, "b": ["x", ""]},
        [7, "/org/x", "g(ii)"],
    ]


def test_marshalling_agrees_with_dbus_fast_byte_for_byte() -> None:
    sig = "ssa(sv)a(sa(sv))"
    ours = _wire.marshal(sig, START)
    body = [START[0], "fail", [[k, Variant(s, v)] for k, (s, v) in PROPS.items()], []]
    theirs = bytes(Message(path="/p", member="M", signature=sig, body=body)._marshall(False))
    assert theirs.endswith(ours)  # the body is the message's tail


def test_job_removed_and_errors_are_understood() -> None:
    signal = Message.new_signal(_wire.SD_PATH, _wire.SD_MANAGER, "JobRemoved", "uoss", [
        42, "/org/freedesktop/systemd1/job/42", "a.scope", "done"
    ])  # fmt: skip
    error = Message(
        message_type=MessageType.ERROR,
        error_name="org.freedesktop.DBus.Error.PropertyReadOnly",
        reply_serial=3,
        signature="s",
        body=["Cannot set property OOMPolicy, or unknown property."],
    )
    parsed = _wire._Message(bytes(signal._marshall(False)))
    assert (parsed.kind, parsed.member, parsed.body) == (4, "JobRemoved", signal.body)
    parsed = _wire._Message(bytes(error._marshall(False)))
    assert (parsed.kind, parsed.reply_to, parsed.error) == (3, 3, error.error_name)
    assert parsed.body == error.body


def test_big_endian_peers_are_read() -> None:
    data = struct.pack(">I4xQ", 42, 2**40) + struct.pack(">I", 4) + b"done\0"
    assert _wire.unmarshal("uts", data, ">") == [42, 2**40, "done"]


@pytest.mark.parametrize(
    ("address", "path"),
    [
        ("unix:path=/run/dbus/system_bus_socket", "/run/dbus/system_bus_socket"),
        ("unix:path=/run/user/1000/bus,guid=0123", "/run/user/1000/bus"),
        ("unix:abstract=/tmp/dbus-x", "\0/tmp/dbus-x"),
    ],
)
def test_unix_addresses(address: str, path: str) -> None:
    assert _wire._socket_path(address) == path


@pytest.mark.parametrize(
    "address",
    [
        "tcp:host=localhost,port=1",
        "unix:path=/a;unix:path=/b",
        "unix:path=/a%20b",
        "unix:tmpdir=/t",
    ],
)
def test_other_addresses_are_left_to_dbus_fast(address: str) -> None:
    with pytest.raises(_wire.Unsupported):
        _wire._socket_path(address)


def test_authenticates_as_its_uid(server: Server) -> None:
    _wire.Connection("user", server.address, direct=True, timeout=5).close()
    server.received()
    uid = str(os.geteuid()).encode().hex().encode()
    assert server.auth == b"\0AUTH EXTERNAL " + uid + b"\r\nBEGIN\r\n"


def test_nothing_listening_is_systemd_unavailable(tmp_path: Any) -> None:
    with pytest.raises(SystemdUnavailable, match="FileNotFoundError"):
        _wire.Connection("user", f"unix:path={tmp_path}/none", direct=True)


# -- hostile peers (#16) --------------------------------------------------------------

JOB = "/org/freedesktop/systemd1/job/42"


def _job_removed(sender: str | None, result: str, path: str = _wire.SD_PATH) -> bytes:
    # Built here: dbus-fast, a client, never writes the sender field a bus adds.
    payload = _wire.marshal("uoss", [42, JOB, "a.scope", result])
    fields: list[tuple[int, tuple[str, str]]] = [
        (1, ("o", path)),
        (2, ("s", _wire.SD_MANAGER)),
        (3, ("s", "JobRemoved")),
        (8, ("g", "uoss")),
    ]
    if sender is not None:
        fields.append((7, ("s", sender)))
    header = bytearray(struct.pack("<cBBBII", b"l", 4, 0, 1, len(payload), 1))
    _wire._write(header, "a(yv)", fields)
    _wire._pad(header, 8)
    return bytes(header) + payload


class Pusher(Server):
    """A peer that sends ``messages`` right after the handshake."""

    def __init__(self, path: str, messages: list[bytes]) -> None:
        self.messages = messages
        super().__init__(path)

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        with conn:
            while not self.auth.endswith(b"BEGIN\r\n"):
                self.auth += conn.recv(4096)
            conn.sendall(b"OK 0123456789abcdef0123456789abcdef\r\n" + b"".join(self.messages))
            while conn.recv(4096):
                pass


@pytest.mark.parametrize(
    ("sender", "path", "owner", "direct", "ok"),
    [
        (":1.1", _wire.SD_PATH, ":1.1", False, True),
        (":1.99", _wire.SD_PATH, ":1.1", False, False),  # another local user
        (_wire.SD, _wire.SD_PATH, ":1.1", False, False),  # a well-known name is not a sender
        (":1.1", "/org/freedesktop/systemd1/x", ":1.1", False, False),
        (":1.1", _wire.SD_PATH, None, False, False),  # owner not known yet
        (None, _wire.SD_PATH, None, True, True),  # the private socket: the manager only
        (None, "/elsewhere", None, True, False),
    ],
)
def test_only_the_manager_may_end_a_job(
    sender: str | None, path: str, owner: str | None, direct: bool, ok: bool
) -> None:
    assert _wire.from_systemd(sender, path, _wire.SD_MANAGER, owner, direct) is ok
    assert not _wire.from_systemd(owner, _wire.SD_PATH, "org.example.Forged", owner, direct)


def test_a_forged_job_removed_does_not_end_the_wait(tmp_path: Any) -> None:
    forged = [_job_removed(":1.99", "done"), _job_removed(":1.1", "done", path="/x")]
    peer = Pusher(str(tmp_path / "s"), [*forged, _job_removed(":1.1", "failed")])
    conn = _wire.Connection("system", peer.address, direct=False, timeout=5)
    conn._owner = ":1.1"  # what GetNameOwner answered
    try:
        assert conn.job_result(JOB) == "failed"
    finally:
        conn.close()
        peer.close()


def test_a_huge_declared_message_is_refused_unread(tmp_path: Any) -> None:
    header = struct.pack("<cBBBIII", b"l", 4, 0, 1, 2**31, 1, 0)
    peer = Pusher(str(tmp_path / "s"), [header])
    conn = _wire.Connection("user", peer.address, direct=True, timeout=5)
    try:
        with pytest.raises(SystemdUnavailable, match="announced a message of"):
            conn.job_result(JOB)
    finally:
        conn.close()
        peer.close()


def test_a_malformed_body_is_a_clean_error(tmp_path: Any) -> None:
    good = _job_removed(None, "done")
    bad = good[:-9] + b"\xff\xff\xff\xff" + good[-5:]  # the result's length runs off the end
    peer = Pusher(str(tmp_path / "s"), [bad])
    conn = _wire.Connection("user", peer.address, direct=True, timeout=5)
    try:
        with pytest.raises(SystemdUnavailable, match="malformed message"):
            conn.job_result(JOB)
    finally:
        conn.close()
        peer.close()


@pytest.mark.parametrize("signature", ["a()", "a", "(", "()", "a{vs}", "a{s}", "z", "a" * 40 + "y"])
def test_invalid_signatures_are_refused(signature: str) -> None:
    with pytest.raises(_wire.Malformed):
        _wire.unmarshal(signature, bytes(64))


_SIGNATURES = st.recursive(
    st.sampled_from(list("ybnqiuxtdsogvh")),
    lambda inner: (
        inner.map(lambda t: "a" + t)
        | st.lists(inner, min_size=1, max_size=3).map(lambda ts: "(" + "".join(ts) + ")")
        | st.tuples(st.sampled_from(list("ysu")), inner).map(lambda kv: "a{" + "".join(kv) + "}")
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_SIGNATURES, st.text(alphabet="ay(){}sv", max_size=8)), st.binary(max_size=96))
def test_unmarshal_never_fails_uncleanly(signature: str, data: bytes) -> None:
    try:
        values = _wire.unmarshal(signature, data)
    except _wire.Malformed:
        return
    assert isinstance(values, list)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=128))
def test_a_message_is_parsed_or_refused(data: bytes) -> None:
    with contextlib.suppress(_wire.Malformed):
        _wire._Message(b"l\x04\x00\x01" + data)


def test_a_manager_that_stops_answering_is_a_timeout_not_an_absent_host(tmp_path: Any) -> None:
    # The manager answered the handshake, then nothing (busy with thousands of
    # units, or hung): "is this a systemd host?" would send the user the wrong way.
    peer = Pusher(str(tmp_path / "s"), [])
    conn = _wire.Connection("system", peer.address, direct=True, timeout=0.3)
    try:
        with pytest.raises(SystemdTimeout) as caught:
            conn.job_result(JOB)
    finally:
        conn.close()
        peer.close()
    assert isinstance(caught.value, SystemdUnavailable)  # what callers already catch
    assert caught.value.waiting == f"end of job {JOB}"
    text = str(caught.value)
    assert "busy or hung" in text
    assert "systemctl status" in text
    assert "is this a systemd host" not in text


def test_the_dbus_names_are_written_once() -> None:
    # One set of D-Bus names (_wire.py): a bus, interface, path or error name
    # written as a string anywhere else in the package is a second copy.
    import ast
    from pathlib import Path

    package = Path(_wire.__file__).parent.parent
    elsewhere = []
    for path in sorted(package.rglob("*.py")):
        if path == Path(_wire.__file__):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
                if text.startswith(("org.freedesktop.", "/org/freedesktop/")):
                    elsewhere.append(f"{path.relative_to(package)}:{node.lineno}: {text}")
    assert elsewhere == []
    assert _wire.NO_SUCH_UNIT == "org.freedesktop.systemd1.NoSuchUnit"
    assert _wire.PROPERTIES == "org.freedesktop.DBus.Properties"
