"""The exec path's D-Bus wire format, checked against dbus-fast's in both directions."""

from __future__ import annotations

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

from agentscope import SystemdUnavailable, _scope, _wire

# The StartTransientUnit call of an exec, every property type it sends.
PROPS = {
    **_scope.scope_properties("fleet", "agent", "app-agentscope-agents.slice", 2**30),
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
