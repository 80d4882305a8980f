"""A small blocking D-Bus client: what ``agentscope exec`` needs, and no more.

``agentscope exec`` must start about as fast as ``systemd-run --scope``.
Importing dbus-fast costs about 2 s under TCG (its package ``__init__``
loads the whole library, asyncio with it), many times systemd-run's whole
run, so the exec path speaks the wire protocol itself: a unix socket,
EXTERNAL authentication, method calls and signals read synchronously.
Everything else in agentscope goes through dbus-fast (:mod:`._bus`).

Only C modules are imported: :mod:`_socket` rather than :mod:`socket`,
which pulls in :mod:`enum` and :mod:`selectors` (about 70 ms under TCG).
"""

from __future__ import annotations

import _socket
import os
import struct

from .._errors import BusError, SystemdTimeout, SystemdUnavailable
from .._typecheck import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from collections.abc import Mapping, Sequence
    from typing import Any

__all__ = [
    "Connection",
    "Malformed",
    "Unsupported",
    "addresses",
    "check_signature",
    "from_systemd",
    "marshal",
    "unmarshal",
]

# The D-Bus names agentscope uses, written here once: systemd's
# (org.freedesktop.systemd1(5)) and the bus daemon's and the standard
# interfaces' (the D-Bus specification, "Message Bus Specification").
SD = "org.freedesktop.systemd1"
SD_PATH = "/org/freedesktop/systemd1"
SD_MANAGER = f"{SD}.Manager"
SD_UNIT = f"{SD}.Unit"
SD_SLICE = f"{SD}.Slice"
SD_SCOPE = f"{SD}.Scope"
SD_SERVICE = f"{SD}.Service"
NO_SUCH_UNIT = f"{SD}.NoSuchUnit"
NO_SUCH_PROCESS = f"{SD}.NoSuchProcess"
UNIT_EXISTS = f"{SD}.UnitExists"
DBUS = "org.freedesktop.DBus"
DBUS_PATH = "/org/freedesktop/DBus"
PROPERTIES = f"{DBUS}.Properties"
INTROSPECTABLE = f"{DBUS}.Introspectable"
FAILED = f"{DBUS}.Error.Failed"
NO_REPLY = f"{DBUS}.Error.NoReply"
PROPERTY_READ_ONLY = f"{DBUS}.Error.PropertyReadOnly"
UNKNOWN_PROPERTY = f"{DBUS}.Error.UnknownProperty"
SYSTEM_BUS = "unix:path=/run/dbus/system_bus_socket"

_CALL, _RETURN, _ERROR, _SIGNAL = 1, 2, 3, 4
_NO_REPLY_EXPECTED = 0x1

# Alignment of each type code, and the struct format of the fixed-size ones.
_ALIGN = {
    "y": 1, "b": 4, "n": 2, "q": 2, "i": 4, "u": 4, "x": 8, "t": 8, "d": 8, "h": 4,
    "s": 4, "o": 4, "g": 1, "a": 4, "(": 8, "{": 8, "v": 1,
}  # fmt: skip
_FIXED = {"y": "B", "b": "I", "n": "h", "q": "H", "i": "i", "u": "I", "x": "q", "t": "Q"}
_FIXED.update({"d": "d", "h": "I"})


class Unsupported(Exception):
    """An address this client does not speak (not a plain unix socket): use dbus-fast."""


class Malformed(ValueError):
    """Bytes that are not a valid D-Bus message or body (what it is, in the message)."""


# Limits of the D-Bus specification ("Valid Signatures", "Message Format"),
# the message size much lower: systemd's answers to exec are a few hundred
# bytes, and a peer's declared length must not make us buffer gigabytes.
_MAX_MESSAGE = 8 << 20
_MAX_ARRAY = 1 << 26
_MAX_SIGNATURE = 255
_MAX_DEPTH = 32


def check_signature(signature: str) -> str:
    """``signature`` if it is a valid D-Bus signature, else raise :class:`Malformed`."""
    if len(signature) > _MAX_SIGNATURE:
        raise Malformed(f"signature longer than {_MAX_SIGNATURE}")
    i = 0
    while i < len(signature):
        i = _check_type(signature, i, 0, 0)
    return signature


def _check_type(signature: str, i: int, arrays: int, structs: int) -> int:
    """The end of the complete type at ``i``, checked."""
    if i >= len(signature):
        raise Malformed(f"signature {signature!r} ends inside a type")
    c = signature[i]
    if c == "a":
        if arrays >= _MAX_DEPTH:
            raise Malformed(f"signature {signature!r} nests arrays too deep")
        if signature[i + 1 : i + 2] == "{":
            key = signature[i + 2 : i + 3]
            if key not in _FIXED and key not in ("s", "o", "g"):
                raise Malformed(f"signature {signature!r}: a dict key must be a basic type")
            end = _check_type(signature, i + 3, arrays + 1, structs + 1)
            if signature[end : end + 1] != "}":
                raise Malformed(f"signature {signature!r}: a dict entry holds two types")
            return end + 1
        return _check_type(signature, i + 1, arrays + 1, structs)
    if c == "(":
        if structs >= _MAX_DEPTH:
            raise Malformed(f"signature {signature!r} nests structs too deep")
        j = i + 1
        if signature[j : j + 1] == ")":
            raise Malformed(f"signature {signature!r} has an empty struct")
        while signature[j : j + 1] != ")":
            j = _check_type(signature, j, arrays, structs + 1)
        return j + 1
    if c in _FIXED or c in "sogv":
        return i + 1
    raise Malformed(f"signature {signature!r}: {c!r} is not a type")


def addresses(manager: str, env: Mapping[str, str] = os.environ) -> list[tuple[str, bool]]:
    """The bus addresses to try for a manager, in order, as ``(address, direct)``.

    The user manager: ``$DBUS_SESSION_BUS_ADDRESS``, else ``$XDG_RUNTIME_DIR/bus``,
    else the manager's private socket ``$XDG_RUNTIME_DIR/systemd/private``
    (systemd 257's own ``systemd-run --user`` uses only that one); ``direct``
    means no bus daemon, so no ``Hello``.
    """
    if manager == "system":
        return [(env.get("DBUS_SYSTEM_BUS_ADDRESS", SYSTEM_BUS), False)]
    out: list[tuple[str, bool]] = []
    if session := env.get("DBUS_SESSION_BUS_ADDRESS"):
        out.append((session, False))
    runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{os.geteuid()}"
    if not out and os.path.exists(f"{runtime}/bus"):
        out.append((f"unix:path={runtime}/bus", False))
    out.append((f"unix:path={runtime}/systemd/private", True))
    return out


def _socket_path(address: str) -> str:
    """The socket path of a ``unix:path=`` or ``unix:abstract=`` address."""
    transport, _, params = address.partition(":")
    keys = dict(p.partition("=")[::2] for p in params.split(","))
    if transport != "unix" or ";" in address or "%" in address:
        raise Unsupported(address)
    if "path" in keys:
        return keys["path"]
    if "abstract" in keys:
        return "\0" + keys["abstract"]
    raise Unsupported(address)


# -- marshalling ------------------------------------------------------------------


def _split(signature: str) -> list[str]:
    """The complete types of a signature: ``"sa(sv)u"`` -> ``["s", "a(sv)", "u"]``."""
    out = []
    i = 0
    while i < len(signature):
        end = _type_end(signature, i)
        out.append(signature[i:end])
        i = end
    return out


def _type_end(signature: str, i: int) -> int:
    c = signature[i]
    if c == "a":
        return _type_end(signature, i + 1)
    if c in "({":
        i += 1
        while signature[i] not in ")}":
            i = _type_end(signature, i)
    return i + 1


def _pad(buf: bytearray, n: int) -> None:
    buf.extend(bytes(-len(buf) % n))


def _write(buf: bytearray, t: str, value: Any) -> None:
    c = t[0]
    _pad(buf, _ALIGN[c])
    if c in _FIXED:
        buf += struct.pack("<" + _FIXED[c], value)
    elif c in "so":
        data = value.encode()
        buf += struct.pack("<I", len(data)) + data + b"\0"
    elif c == "g":
        data = value.encode()
        buf += bytes((len(data),)) + data + b"\0"
    elif c == "v":
        inner, item = value
        _write(buf, "g", inner)
        _write(buf, inner, item)
    elif c == "a":
        at = len(buf)
        buf += bytes(4)
        _pad(buf, _ALIGN[t[1]])
        start = len(buf)
        for item in value.items() if t[1] == "{" else value:
            _write(buf, t[1:], item)
        struct.pack_into("<I", buf, at, len(buf) - start)
    else:  # a struct or dict entry
        for sub, item in zip(_split(t[1:-1]), value, strict=True):
            _write(buf, sub, item)


def marshal(signature: str, body: Sequence[Any]) -> bytes:
    """A message body in little-endian wire format; a variant is ``(signature, value)``."""
    buf = bytearray()
    for t, value in zip(_split(signature), body, strict=True):
        _write(buf, t, value)
    return bytes(buf)


class _Reader:
    def __init__(self, data: bytes, endian: str, pos: int) -> None:
        self.data, self.endian, self.pos = data, endian, pos
        self.depth = 0

    def read(self, t: str) -> Any:
        c = t[0]
        self.pos += -self.pos % _ALIGN[c]
        if c in _FIXED:
            fmt = self.endian + _FIXED[c]
            (value,) = struct.unpack_from(fmt, self.data, self.pos)
            self.pos += struct.calcsize(fmt)
            return bool(value) if c == "b" else value
        if c in "sog":
            if c == "g":
                n = self.data[self.pos]
                self.pos += 1
            else:
                n = self.read("u")
            if self.pos + n >= len(self.data):
                raise Malformed("a string runs past the end of the message")
            text = self.data[self.pos : self.pos + n].decode()
            self.pos += n + 1
            return text
        self.depth += 1
        try:
            if self.depth > 2 * _MAX_DEPTH:
                raise Malformed("values nested too deep")
            if c == "v":
                inner = check_signature(self.read("g"))
                if not inner or _type_end(inner, 0) != len(inner):
                    raise Malformed(f"a variant of {inner!r}, not one complete type")
                return self.read(inner)
            if c == "a":
                size = self.read("u")
                self.pos += -self.pos % _ALIGN[t[1]]
                end = self.pos + size
                if size > _MAX_ARRAY or end > len(self.data):
                    raise Malformed("an array runs past the end of the message")
                items = []
                while self.pos < end:
                    items.append(self.read(t[1:]))
                if self.pos != end:
                    raise Malformed("an array's items overrun its length")
                return dict(items) if t[1] == "{" else items
            return [self.read(sub) for sub in _split(t[1:-1])]
        finally:
            self.depth -= 1


def unmarshal(signature: str, data: bytes, endian: str = "<", pos: int = 0) -> list[Any]:
    """The values of a body: a variant becomes its value, a struct a list.

    Raises:
        Malformed: the signature is not valid, or the bytes do not hold it.
    """
    reader = _Reader(data, endian, pos)
    try:
        return [reader.read(t) for t in _split(check_signature(signature))]
    except (struct.error, IndexError, UnicodeDecodeError, TypeError) as exc:
        raise Malformed(f"a body of signature {signature!r} that does not parse ({exc})") from exc


def from_systemd(
    sender: str | None, path: str | None, interface: str | None, owner: str | None, direct: bool
) -> bool:
    """Whether a signal comes from the systemd manager, for both D-Bus clients.

    On a bus any local user may send a unicast signal, so only the unique
    name owning ``org.freedesktop.systemd1`` (``owner``, None while not
    known) is believed. A direct connection (the manager's private socket)
    has no sender: the transport itself is the proof.
    """
    if path != SD_PATH or interface != SD_MANAGER:
        return False
    return direct or (owner is not None and sender == owner)


class _Message:
    __slots__ = ("body", "error", "interface", "kind", "member", "path", "reply_to", "sender")

    def __init__(self, data: bytes) -> None:
        try:
            endian = {b"l": "<", b"B": ">"}[data[:1]]
            self.kind = data[1]
            fields = dict(unmarshal("a(yv)", data, endian, 12)[0])
            header_end = 16 + struct.unpack_from(endian + "I", data, 12)[0]
        except (KeyError, IndexError, struct.error, TypeError) as exc:
            raise Malformed(f"not a D-Bus message header ({exc})") from exc
        self.path = fields.get(1, "")
        self.interface = fields.get(2, "")
        self.member = fields.get(3, "")
        self.error = fields.get(4, "")
        self.reply_to = fields.get(5, 0)
        self.sender = fields.get(7)
        header_end += -header_end % 8
        self.body: list[Any] = []
        # A private socket gets every signal of the manager: read only ours.
        if self.kind != _SIGNAL or self.member == "JobRemoved":
            signature = fields.get(8, "")
            if not isinstance(signature, str):
                raise Malformed("the signature field is not a signature")
            self.body = unmarshal(signature, data, endian, header_end)


class Connection:
    """One blocking connection to a systemd manager (bus or private socket).

    Raises:
        Unsupported: the address is not a unix socket this client speaks.
        SystemdUnavailable: nothing listens there, the manager refused us, or
            no answer came within ``timeout`` seconds.
    """

    def __init__(self, manager: str, address: str, direct: bool, timeout: float = 60) -> None:
        self.manager, self.address, self.direct = manager, address, direct
        path = _socket_path(address)
        self._sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._timeout = timeout
        self._buf = bytearray()
        self._serial = 0
        self._replies: dict[int, _Message] = {}
        self._signals: list[_Message] = []
        self._owner: str | None = None
        self._owner_serial = 0
        try:
            self._sock.connect(path)
            # BEGIN goes with AUTH, as sd-bus's own clients send it: it saves
            # a round trip, and sd-bus serving a private socket stalls a
            # connection whose first message arrives in the read that holds
            # BEGIN. Messages are sent only once the answer is in.
            uid = str(os.geteuid()).encode().hex().encode()
            self._sock.sendall(b"\0AUTH EXTERNAL " + uid + b"\r\nBEGIN\r\n")
            line = self._line()
            if not line.startswith(b"OK "):
                raise self._unavailable(f"authentication refused ({line.decode(errors='replace')})")
        except OSError as exc:
            self.close()
            raise self._unavailable(_reason(exc)) from exc
        except BaseException:
            self.close()
            raise

    def _unavailable(self, reason: str) -> SystemdUnavailable:
        return SystemdUnavailable(self.manager, self.address, reason)

    def _lost(self, exc: OSError, waiting: str) -> SystemdUnavailable:
        """The error for a call on the open connection: a manager that was reached
        and stopped answering is busy or hung, not absent."""
        if isinstance(exc, TimeoutError):
            return SystemdTimeout(self.manager, self.address, waiting, self._timeout)
        return self._unavailable(_reason(exc))

    def close(self) -> None:
        self._sock.close()

    def _fill(self) -> None:
        chunk = self._sock.recv(65536)
        if not chunk:
            raise self._unavailable("the connection was closed")
        self._buf += chunk

    def _line(self) -> bytes:
        while b"\r\n" not in self._buf:
            self._fill()
        line, _, rest = bytes(self._buf).partition(b"\r\n")
        self._buf = bytearray(rest)
        return line

    def _receive(self) -> None:
        """Read one message into the replies or the signals."""
        while len(self._buf) < 16:
            self._fill()
        endian = "<" if self._buf[:1] == b"l" else ">"
        body_len, _serial, fields_len = struct.unpack_from(endian + "III", self._buf, 4)
        total = 16 + fields_len
        total += -total % 8 + body_len
        if total > _MAX_MESSAGE:
            raise self._unavailable(f"the peer announced a message of {total} bytes")
        while len(self._buf) < total:
            self._fill()
        try:
            msg = _Message(bytes(self._buf[:total]))
        except Malformed as exc:
            raise self._unavailable(f"a malformed message came: {exc}") from exc
        finally:
            del self._buf[:total]
        if msg.kind in (_RETURN, _ERROR):
            self._replies[msg.reply_to] = msg
        elif msg.kind == _SIGNAL:
            self._signals.append(msg)

    def send(
        self,
        member: str,
        signature: str = "",
        body: Sequence[Any] = (),
        *,
        path: str = SD_PATH,
        interface: str = SD_MANAGER,
        destination: str = SD,
    ) -> int:
        """Send a method call without waiting; returns its serial for :meth:`reply`."""
        self._serial += 1
        payload = marshal(signature, body)
        fields: list[tuple[int, tuple[str, str]]] = [
            (1, ("o", path)),
            (2, ("s", interface)),
            (3, ("s", member)),
        ]
        if not self.direct:
            fields.append((6, ("s", destination)))
        if signature:
            fields.append((8, ("g", signature)))
        header = bytearray(struct.pack("<cBBBII", b"l", _CALL, 0, 1, len(payload), self._serial))
        _write(header, "a(yv)", fields)
        _pad(header, 8)
        try:
            self._sock.sendall(bytes(header) + payload)
        except OSError as exc:
            raise self._lost(exc, "room to send a call") from exc
        return self._serial

    def reply(self, serial: int, method: str) -> list[Any]:
        """The body of the reply to ``serial``; an error reply raises :class:`BusError`."""
        try:
            while serial not in self._replies:
                self._receive()
        except OSError as exc:
            raise self._lost(exc, f"reply to {method}") from exc
        msg = self._replies.pop(serial)
        if msg.kind == _ERROR:
            raise BusError.from_reply(method, msg.error, msg.body)
        return msg.body

    def call(self, member: str, signature: str = "", body: Sequence[Any] = ()) -> list[Any]:
        """Call a systemd manager method and wait for its reply."""
        return self.reply(self.send(member, signature, body), member)

    def greet(self) -> list[tuple[int, str]]:
        """Send the opening calls without waiting: ``[(serial, method)]`` to check later.

        On a bus: ``Hello``, then a match for systemd's ``JobRemoved``; on
        both, ``Subscribe`` (on a direct connection signals come unasked).
        Sending them in one go saves two round trips, as sd-bus does.
        """
        sent = []
        if not self.direct:
            bus = {"path": DBUS_PATH, "interface": DBUS, "destination": DBUS}
            rule = f"type='signal',sender='{SD}',interface='{SD_MANAGER}',member='JobRemoved'"
            sent.append((self.send("Hello", **bus), "Hello"))
            sent.append((self.send("AddMatch", "s", [rule], **bus), "AddMatch"))
            self._owner_serial = self.send("GetNameOwner", "s", [SD], **bus)
        sent.append((self.send("Subscribe"), "Subscribe"))
        return sent

    def _systemd_owner(self) -> str | None:
        """The unique bus name of the manager (None on a direct connection)."""
        if self.direct:
            return None
        if self._owner is None:
            if not self._owner_serial:
                self.greet()
            (owner,) = self.reply(self._owner_serial, "GetNameOwner")
            self._owner = str(owner)
        return self._owner

    def job_result(self, job: str) -> str:
        """Wait for ``JobRemoved`` of the job object ``job``; its result (``done``, ...)."""
        owner = self._systemd_owner()
        try:
            while True:
                for msg in self._signals:
                    if (
                        msg.member == "JobRemoved"
                        and from_systemd(msg.sender, msg.path, msg.interface, owner, self.direct)
                        and len(msg.body) == 4
                        and msg.body[1] == job
                    ):
                        return str(msg.body[3])
                self._signals.clear()
                self._receive()
        except OSError as exc:
            raise self._lost(exc, f"end of job {job}") from exc


def _reason(exc: OSError) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return f"{type(exc).__name__}: {exc.strerror or exc}"
