"""Which bus each manager is reached on, and how D-Bus errors are mapped."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from pathlib import Path
from typing import Any

import pytest
from dbus_fast import Message, MessageType, Variant

from agentscope_systemd import BusError, SystemdTimeout
from agentscope_systemd._managers._bus import (
    SD,
    SD_MANAGER,
    SD_PATH,
    SYSTEM_BUS,
    BusAddress,
    SystemdBus,
    _check,
    _DirectBus,
    bus_addresses,
    resolve_manager,
)


def test_system_manager_uses_system_bus() -> None:
    assert bus_addresses("system", {}) == [BusAddress(SYSTEM_BUS)]
    assert bus_addresses("system", {"DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/x"}) == [
        BusAddress("unix:path=/x")
    ]


def test_user_manager_prefers_session_bus_then_private_socket(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {"DBUS_SESSION_BUS_ADDRESS": "unix:path=/s", "XDG_RUNTIME_DIR": str(tmp_path)}
    got = bus_addresses("user", env)
    assert got[0] == BusAddress("unix:path=/s")
    assert got[-1] == BusAddress(f"unix:path={tmp_path}/systemd/private", direct=True)


def test_user_bus_socket_used_when_no_session_address(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "bus").touch()
    got = bus_addresses("user", {"XDG_RUNTIME_DIR": str(tmp_path)})
    assert got[0] == BusAddress(f"unix:path={tmp_path}/bus")
    assert got[1].direct


def test_no_user_bus_leaves_only_private_socket(tmp_path) -> None:  # type: ignore[no-untyped-def]
    got = bus_addresses("user", {"XDG_RUNTIME_DIR": str(tmp_path)})
    assert got == [BusAddress(f"unix:path={tmp_path}/systemd/private", direct=True)]


async def test_a_missing_socket_is_systemd_unavailable_even_from_the_constructor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Older dbus-fast connects the socket in ``MessageBus()`` itself: a host without
    systemd is still exit 4's SystemdUnavailable, never a bare FileNotFoundError."""
    import agentscope_systemd._managers._bus as bus_module
    from agentscope_systemd import SystemdUnavailable

    missing = tmp_path / "no-bus"

    class ConnectsAtOnce:  # a stand-in: this dbus-fast's own MessageBus connects later
        def __init__(self, **kwargs: Any) -> None:
            raise FileNotFoundError(2, "No such file or directory", str(missing))

    monkeypatch.setattr(bus_module, "MessageBus", ConnectsAtOnce)
    bus = SystemdBus("system", env={"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={missing}"})
    with pytest.raises(SystemdUnavailable, match=r"FileNotFoundError.*no-bus"):
        await bus.connect()


def test_resolve_manager() -> None:
    assert resolve_manager("system") == "system"
    assert resolve_manager("auto") in ("system", "user")
    with pytest.raises(ValueError, match="manager must be"):
        resolve_manager("both")


def test_error_reply_becomes_bus_error_with_name_and_text() -> None:
    reply = Message(
        message_type=MessageType.ERROR,
        error_name="org.freedesktop.DBus.Error.PropertyReadOnly",
        reply_serial=1,
        signature="s",
        body=["Cannot set property OOMPolicy, or unknown property."],
    )
    with pytest.raises(BusError) as info:
        _check("StartTransientUnit", reply)
    assert info.value.dbus_name == "org.freedesktop.DBus.Error.PropertyReadOnly"
    assert info.value.method == "StartTransientUnit"
    assert "OOMPolicy" in info.value.message
    assert "StartTransientUnit" in str(info.value)


async def test_direct_connection_sends_begin_before_any_answer(tmp_path: Path) -> None:
    # sd-bus, serving systemd's private socket, leaves a message that came in
    # the same read as BEGIN unprocessed until more bytes arrive: a client
    # that sends BEGIN on its own and its first call right behind it stalls
    # on a manager slow to read. So the whole handshake, BEGIN included, must
    # come before any answer (this server answers nothing until then).
    # What the manager sends right behind its last answer is a message.
    (tmp_path / "systemd").mkdir()
    uid = str(os.getuid()).encode().hex().encode()
    job_removed = Message.new_signal(
        SD_PATH, SD_MANAGER, "JobRemoved", "uoss", [7, f"{SD_PATH}/job/7", "a.scope", "done"]
    )
    job_removed.serial = 1
    handshakes: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handshakes.append(await reader.readuntil(b"BEGIN\r\n"))
        writer.write(b"OK " + b"0" * 32 + b"\r\nAGREE_UNIX_FD\r\n")
        writer.write(job_removed._marshall(False))
        fixed = await reader.readexactly(16)
        body_len, call_serial, fields_len = struct.unpack("<III", fixed[4:])
        call = await reader.readexactly(fields_len + (-fields_len % 8) + body_len)
        assert b"Subscribe" in call
        writer.write(
            Message(
                message_type=MessageType.METHOD_RETURN, reply_serial=call_serial, serial=2
            )._marshall(False)
        )
        await reader.read()  # until the client hangs up
        writer.close()
        await writer.wait_closed()

    served: list[asyncio.Task[None]] = []
    server = await asyncio.start_unix_server(
        lambda r, w: served.append(asyncio.ensure_future(serve(r, w))),
        tmp_path / "systemd" / "private",
    )
    bus = _DirectBus(bus_address=f"unix:path={tmp_path}/systemd/private", negotiate_unix_fd=True)
    received: list[Message] = []
    bus.add_message_handler(lambda msg: received.append(msg) and None)
    try:
        async with asyncio.timeout(10):
            await bus.connect()
            reply = await bus.call(Message(path=SD_PATH, interface=SD_MANAGER, member="Subscribe"))
        assert handshakes == [b"\0AUTH EXTERNAL " + uid + b"\r\nNEGOTIATE_UNIX_FD\r\nBEGIN\r\n"]
        assert reply.message_type == MessageType.METHOD_RETURN
        signals = [m for m in received if m.message_type == MessageType.SIGNAL]
        assert [(m.member, m.body) for m in signals] == [("JobRemoved", job_removed.body)]
    finally:
        bus.disconnect()
        server.close()
        await asyncio.wait_for(asyncio.gather(*served), 10)


async def test_the_dbus_fast_internals_the_direct_connection_uses_are_still_there() -> None:
    """_DirectBus (the private socket, no Hello) reuses these dbus-fast internals.

    They are not public API: an upgrade that renames or reshapes one must
    fail here, loudly, rather than on a user's private socket.
    """
    import inspect

    from dbus_fast.aio import MessageBus
    from dbus_fast.aio.message_bus import _MessageWriter
    from dbus_fast.aio.message_reader import build_message_reader

    bus = MessageBus(bus_address="unix:path=/nonexistent", negotiate_unix_fd=True)
    for attr in ("_bus_address", "_loop", "_negotiate_unix_fd", "_sock", "_stream", "_fd"):
        assert hasattr(bus, attr), attr
    for method in ("_create_socket_for_transport", "_process_message", "_finalize"):
        assert callable(getattr(bus, method, None)), method
    assert bus._bus_address == [("unix", {"path": "/nonexistent"})]
    assert list(inspect.signature(build_message_reader).parameters)[:4] == [
        "sock",
        "process",
        "finalize",
        "negotiate_unix_fd",
    ]
    assert callable(getattr(_MessageWriter, "schedule_write", None))
    assert list(inspect.signature(_MessageWriter).parameters) == ["bus"]


def _signal(sender: str | None, member: str, signature: str, body: list[Any], **kw: Any) -> Message:
    fields = {"path": SD_PATH, "interface": SD_MANAGER, **kw}
    return Message(
        message_type=MessageType.SIGNAL,
        member=member,
        signature=signature,
        body=body,
        sender=sender,
        **fields,
    )


def _removed(sender: str | None, result: str, **kw: Any) -> Message:
    return _signal(sender, "JobRemoved", "uoss", [7, f"{SD_PATH}/job/7", "a.scope", result], **kw)


async def test_job_removed_is_believed_only_from_the_manager() -> None:
    bus = SystemdBus("system")
    bus._owner = ":1.1"
    fut = bus.expect_job("a.scope")
    bus._on_message(_removed(":1.99", "done"))  # another local user, unicast
    bus._on_message(_removed(":1.1", "done", path="/org/freedesktop/systemd1/unit/x"))
    bus._on_message(_removed(":1.1", "done", interface="org.example.Manager"))
    assert not fut.done()
    # The manager re-executed: only the bus daemon may say so.
    rename = [SD, ":1.1", ":1.5"]
    bus._on_message(_signal(":1.99", "NameOwnerChanged", "sss", rename, path="/x"))
    bus._on_message(_removed(":1.5", "done"))
    assert not fut.done()
    bus._on_message(
        _signal(
            "org.freedesktop.DBus",
            "NameOwnerChanged",
            "sss",
            rename,
            path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus",
        )
    )
    bus._on_message(_removed(":1.5", "failed"))
    assert fut.result() == "failed"


async def test_on_a_direct_connection_the_transport_is_the_proof() -> None:
    bus = SystemdBus("user")
    bus._direct = True
    fut = bus.expect_job("a.scope")
    bus._on_message(_removed(None, "done", path="/elsewhere"))
    assert not fut.done()
    bus._on_message(_removed(None, "done"))
    assert fut.result() == "done"


async def test_a_manager_that_stops_answering_is_a_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Connected (Subscribe and Version answered), then silence: a busy or hung
    # manager, which the message must not call an absent systemd host.
    monkeypatch.setattr("agentscope_systemd._managers._bus.CALL_TIMEOUT", 0.3)
    (tmp_path / "systemd").mkdir()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"BEGIN\r\n")
        writer.write(b"OK " + b"0" * 32 + b"\r\nAGREE_UNIX_FD\r\n")
        serial = 100
        with contextlib.suppress(asyncio.IncompleteReadError):
            while True:
                fixed = await reader.readexactly(16)
                body_len, call_serial, fields_len = struct.unpack("<III", fixed[4:])
                call = await reader.readexactly(fields_len + (-fields_len % 8) + body_len)
                serial += 1
                if b"Subscribe" in call:
                    reply = Message(
                        message_type=MessageType.METHOD_RETURN, reply_serial=call_serial
                    )
                elif b"Version" in call:
                    reply = Message(
                        message_type=MessageType.METHOD_RETURN,
                        reply_serial=call_serial,
                        signature="v",
                        body=[Variant("s", "257")],
                    )
                else:
                    continue  # no answer, ever
                reply.serial = serial
                writer.write(reply._marshall(False))
        writer.close()

    served: list[asyncio.Task[None]] = []
    server = await asyncio.start_unix_server(
        lambda r, w: served.append(asyncio.ensure_future(serve(r, w))),
        tmp_path / "systemd" / "private",
    )
    bus = SystemdBus("user", env={"XDG_RUNTIME_DIR": str(tmp_path)})
    try:
        await bus.connect()
        assert bus.version == "257"
        with pytest.raises(SystemdTimeout) as caught:
            await bus.call("ListUnits")
    finally:
        bus.close()
        server.close()
        await asyncio.wait_for(asyncio.gather(*served), 10)
    assert caught.value.waiting == "reply to ListUnits"
    assert "busy or hung" in str(caught.value)
    assert "systemctl --user status" in str(caught.value)
