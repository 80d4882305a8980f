"""Which bus each manager is reached on, and how D-Bus errors are mapped."""

from __future__ import annotations

import pytest
from dbus_fast import Message, MessageType

from agentscope import BusError
from agentscope._bus import SYSTEM_BUS, BusAddress, _check, bus_addresses, resolve_manager


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
