"""The D-Bus connection to a systemd manager, over dbus-fast.

One :class:`SystemdBus` per fleet: it finds the manager's bus, subscribes to
job signals once per connection, maps every D-Bus error to agentscope's
errors in one place (:func:`_check`), and reconnects on the next call after
the connection dropped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus
from dbus_fast.aio.message_bus import _MessageWriter
from dbus_fast.aio.message_reader import build_message_reader
from dbus_fast.errors import AuthError, InvalidAddressError

from .. import _names, _numbers
from .._errors import BusError, SystemdTimeout, SystemdUnavailable
from . import _wire
from ._scope import CGROUP_ROOT

__all__ = [
    "INFINITY",
    "BusAddress",
    "Manager",
    "SystemdBus",
    "bus_addresses",
    "resolve_manager",
]

log = logging.getLogger("agentscope")

Manager = Literal["system", "user"]
SD, SD_PATH, SD_MANAGER, PROPS = _wire.SD, _wire.SD_PATH, _wire.SD_MANAGER, _wire.PROPERTIES
INFINITY = 2**64 - 1  # systemd's "infinity" for limits (uint64 max)
SYSTEM_BUS = _wire.SYSTEM_BUS
CALL_TIMEOUT = 60.0  # seconds for a method reply; systemd answers in milliseconds


@dataclass(frozen=True)
class BusAddress:
    """Where to reach a manager; ``direct`` is a private socket with no bus daemon."""

    address: str
    direct: bool = False


def resolve_manager(manager: str) -> Manager:
    """``auto`` means the system manager for root, the user manager otherwise."""
    return _names.resolve_manager(manager)  # type: ignore[return-value]


def bus_addresses(manager: Manager, env: Mapping[str, str] = os.environ) -> list[BusAddress]:
    """The addresses to try, in order, for a manager.

    The user manager: ``$DBUS_SESSION_BUS_ADDRESS``, else ``$XDG_RUNTIME_DIR/bus``,
    else the manager's private socket ``$XDG_RUNTIME_DIR/systemd/private``
    (systemd 257's own ``systemd-run --user`` uses only that one).
    """
    return [BusAddress(address, direct) for address, direct in _wire.addresses(manager, env)]


class _DirectBus(MessageBus):
    """A peer-to-peer connection, as to systemd's private socket: no bus daemon, no Hello.

    dbus-fast's ``connect()`` always greets a bus daemon with ``Hello``,
    which a manager's private socket answers with an error; this is the same
    connect and read set-up without it, and with the handshake sent in one
    piece as systemd's own clients send it (:meth:`_handshake` says why).
    """

    async def connect(self) -> MessageBus:
        ((transport, options),) = self._bus_address
        sock, stream, address = self._create_socket_for_transport(transport, options)
        sock.setblocking(False)
        try:
            await self._loop.sock_connect(sock, address)
            self._sock, self._stream, self._fd = sock, stream, sock.fileno()
            self._writer = _MessageWriter(self)
            await self._handshake(sock)
        except BaseException:
            stream.close()
            sock.close()
            self._sock = self._stream = self._fd = self._writer = None
            raise
        self._loop.add_reader(
            self._fd,
            build_message_reader(
                self._sock, self._process_message, self._finalize, self._negotiate_unix_fd
            ),
        )
        # The writer holds messages back until the connection has a name.
        self.unique_name = ":direct"
        self._writer.schedule_write()
        return self

    async def _handshake(self, sock: socket.socket) -> None:
        """SASL EXTERNAL with ``BEGIN`` sent up front, before any answer.

        sd-bus, serving the private socket, stalls a connection whose first
        message reaches it in the same read as ``BEGIN``: it keeps the
        message in its buffer and waits for the socket to become readable
        again, which it never does if the client then waits for the reply.
        dbus-fast's handshake sends ``BEGIN`` on its own and the first
        message right after it, so a manager slow to read (a loaded host)
        got both at once. Sent with the other lines, ``BEGIN`` is in the
        manager's buffer before it answers, and is handled before it reads
        again, so the first message always comes in a read of its own (this
        is how systemd's own clients, ``systemctl`` among them, connect).
        """
        uid = str(os.getuid()).encode().hex().encode()
        fds = b"NEGOTIATE_UNIX_FD\r\n" if self._negotiate_unix_fd else b""
        await self._loop.sock_sendall(
            sock, b"\0AUTH EXTERNAL " + uid + b"\r\n" + fds + b"BEGIN\r\n"
        )
        answer = await self._sasl_line(sock)
        if not answer.startswith(b"OK "):
            raise AuthError(f"authentication failed: {answer!r}")
        if fds and (answer := await self._sasl_line(sock)) != b"AGREE_UNIX_FD":
            raise AuthError(f"unix fd passing refused: {answer!r}")

    async def _sasl_line(self, sock: socket.socket) -> bytes:
        # A byte at a time: the manager may send signals right after its last
        # answer, and those bytes belong to the message reader.
        line = b""
        while not line.endswith(b"\r\n"):
            byte = await self._loop.sock_recv(sock, 1)
            if not byte:
                raise AuthError("connection closed during authentication")
            line += byte
            if len(line) > 1024:
                raise AuthError("authentication answer too long")
        return line[:-2]


def _daemon_call(member: str, arg: str) -> Message:
    """A call to the bus daemon itself taking one string."""
    return Message(
        destination=_wire.DBUS,
        path=_wire.DBUS_PATH,
        interface=_wire.DBUS,
        member=member,
        signature="s",
        body=[arg],
    )


def _check(method: str, reply: Message | None) -> list[Any]:
    """The body of a method return; every D-Bus error becomes a BusError here."""
    if reply is None:
        raise BusError(method, _wire.NO_REPLY, "no reply")
    if reply.message_type == MessageType.ERROR:
        raise BusError.from_reply(method, reply.error_name, reply.body)
    return list(reply.body)


class SystemdBus:
    """A connection to one systemd manager, reconnected on demand."""

    def __init__(self, manager: str = "auto", *, env: Mapping[str, str] | None = None) -> None:
        self.manager: Manager = resolve_manager(manager)
        self._env = dict(os.environ if env is None else env)
        self._bus: MessageBus | None = None
        self.address: str = ""
        self.version: str = ""
        self._lock = asyncio.Lock()
        self._jobs: dict[str, asyncio.Future[str]] = {}
        #: Where the manager's cgroup paths (ControlGroup) are mounted.
        self.cgroup_root = Path(CGROUP_ROOT)
        # Who may send JobRemoved (see _wire.from_systemd): the unique name of
        # the manager on a bus, nobody's name on a direct connection.
        self._owner: str | None = None
        self._direct = False

    @property
    def version_major(self) -> int:
        digits = ""
        for c in self.version:
            if not _numbers.is_digits(c):
                break
            digits += c
        return int(digits or 0)

    async def connect(self) -> MessageBus:
        """The live connection, connecting (again) if needed."""
        if self._bus is not None and self._bus.connected:
            return self._bus
        async with self._lock:
            if self._bus is not None and self._bus.connected:
                return self._bus
            tried: list[str] = []
            for addr in bus_addresses(self.manager, self._env):
                bus_class = _DirectBus if addr.direct else MessageBus
                try:
                    # The address is parsed here: a malformed $DBUS_*_ADDRESS
                    # is an unreachable manager (exit 4), not a bug. Older dbus-fast
                    # (2.21, issue 28) also connects the socket here: a missing one
                    # is FileNotFoundError from the constructor.
                    bus = bus_class(bus_address=addr.address, negotiate_unix_fd=True)
                except (InvalidAddressError, OSError) as exc:
                    tried.append(f"{addr.address} ({exc.__class__.__name__}: {exc})")
                    continue
                try:
                    async with asyncio.timeout(10):
                        await bus.connect()
                    async with asyncio.timeout(10):
                        await self._subscribe(bus, addr.direct)
                except (OSError, AuthError, InvalidAddressError, TimeoutError, BusError) as exc:
                    bus.disconnect()
                    tried.append(f"{addr.address} ({exc.__class__.__name__}: {exc})")
                    continue
                self._bus, self.address = bus, addr.address
                asyncio.get_running_loop().create_task(self._watch(bus))
                version = await self.get_property(SD_PATH, SD_MANAGER, "Version")
                self.version = str(version)
                log.debug(
                    "connected to the %s manager (systemd %s) at %s",
                    self.manager,
                    self.version,
                    self.address,
                )
                return bus
            raise SystemdUnavailable(
                self.manager,
                ", ".join(a.address for a in bus_addresses(self.manager, self._env)),
                "; ".join(tried) or "no address to try",
            )

    async def _subscribe(self, bus: MessageBus, direct: bool) -> None:
        self._owner, self._direct = None, direct
        bus.add_message_handler(self._on_message)
        if not direct:
            rules = (
                f"type='signal',sender='{SD}',interface='{SD_MANAGER}',member='JobRemoved'",
                # A manager that re-executes comes back under a new unique name.
                f"type='signal',sender='{_wire.DBUS}',member='NameOwnerChanged',arg0='{SD}'",
            )
            for rule in rules:
                _check("AddMatch", await bus.call(_daemon_call("AddMatch", rule)))
            (owner,) = _check("GetNameOwner", await bus.call(_daemon_call("GetNameOwner", SD)))
            self._owner = str(owner)
        # Subscribe() makes the manager emit JobRemoved at all; on a direct
        # connection it is also what routes the signals to us.
        _check(
            "Subscribe",
            await bus.call(
                Message(
                    destination=None if direct else SD,
                    path=SD_PATH,
                    interface=SD_MANAGER,
                    member="Subscribe",
                )
            ),
        )

    async def _watch(self, bus: MessageBus) -> None:
        await bus.wait_for_disconnect()  # type: ignore[no-untyped-call]
        if self._bus is bus:
            self._bus = None
        err = SystemdUnavailable(self.manager, self.address, "the connection was lost")
        for fut in self._jobs.values():
            if not fut.done():
                fut.set_exception(err)
        self._jobs.clear()

    def _on_message(self, msg: Message) -> bool:
        if msg.message_type != MessageType.SIGNAL:
            return False
        if msg.member == "NameOwnerChanged" and msg.sender == _wire.DBUS and not self._direct:
            # Sent by the bus daemon itself: nobody else can use its name.
            if len(msg.body) == 3 and msg.body[0] == SD:
                self._owner = str(msg.body[2]) or None
            return False
        if (
            msg.member == "JobRemoved"
            and msg.signature == "uoss"
            and _wire.from_systemd(msg.sender, msg.path, msg.interface, self._owner, self._direct)
        ):
            _id, _job, unit, result = msg.body
            fut = self._jobs.get(unit)
            if fut is not None and not fut.done():
                fut.set_result(result)
        return False

    def close(self) -> None:
        """Disconnect; a later call connects again."""
        if self._bus is not None:
            self._bus.disconnect()
            self._bus = None

    async def call(
        self,
        member: str,
        signature: str = "",
        body: Sequence[Any] = (),
        *,
        path: str = SD_PATH,
        interface: str = SD_MANAGER,
        unix_fds: Sequence[int] = (),
    ) -> list[Any]:
        """Call a systemd method; raises BusError or SystemdUnavailable."""
        bus = await self.connect()
        msg = Message(
            destination=SD,
            path=path,
            interface=interface,
            member=member,
            signature=signature,
            body=list(body),
            unix_fds=list(unix_fds),
        )
        try:
            # asyncio.timeout, never wait_for: 3.11's wait_for returns the result
            # and drops a cancellation that lands as the reply arrives, so a
            # harness's cancel (Ctrl-C, SIGTERM) would be lost.
            async with asyncio.timeout(CALL_TIMEOUT):
                reply = await bus.call(msg)
        except TimeoutError as exc:  # first: TimeoutError is an OSError
            # A manager that never answers must not hang the caller for good.
            raise SystemdTimeout(
                self.manager, self.address, f"reply to {member}", CALL_TIMEOUT
            ) from exc
        except (OSError, EOFError) as exc:
            raise SystemdUnavailable(
                self.manager, self.address, str(exc) or "connection lost"
            ) from exc
        return _check(member, reply)

    async def get_property(self, path: str, interface: str, name: str) -> Any:
        (value,) = await self.call("Get", "ss", [interface, name], path=path, interface=PROPS)
        return value.value

    async def get_all(self, path: str, interface: str) -> dict[str, Any]:
        (props,) = await self.call("GetAll", "s", [interface], path=path, interface=PROPS)
        return {k: v.value for k, v in props.items()}

    async def unit_path(self, unit: str) -> str:
        """The object path of a unit, loading it if needed."""
        (path,) = await self.call("LoadUnit", "s", [unit])
        return str(path)

    def expect_job(self, unit: str) -> asyncio.Future[str]:
        """A future for the result of the next job on ``unit``; register before the call."""
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._jobs[unit] = fut
        return fut

    def forget_job(self, unit: str) -> None:
        self._jobs.pop(unit, None)

    async def run_job(
        self,
        unit: str,
        member: str,
        signature: str,
        body: Sequence[Any],
        *,
        unix_fds: Sequence[int] = (),
        timeout: float | None = None,
    ) -> str:
        """Call a job-returning method and wait for the job's result (``done``, ...)."""
        await self.connect()
        fut = self.expect_job(unit)
        try:
            await self.call(member, signature, body, unix_fds=unix_fds)
            async with asyncio.timeout(timeout):
                return await asyncio.shield(fut)
        finally:
            if self._jobs.get(unit) is fut:
                self.forget_job(unit)

    @staticmethod
    def props(values: Mapping[str, tuple[str, Any]]) -> list[list[Any]]:
        """Pack ``{name: (signature, value)}`` as an ``a(sv)`` array."""
        return [[k, Variant(sig, v)] for k, (sig, v) in values.items()]
