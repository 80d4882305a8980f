"""The OOMPolicy fallback (agentscope_systemd/_managers/_scope.py), as both clients use it.

The async core's use is tested over the fake systemd in tests/test_fleet.py;
here the rule itself and exec's blocking client (_exec._run over a fake
_wire connection).
"""

from __future__ import annotations

from typing import Any

import pytest

from agentscope_systemd._errors import BusError
from agentscope_systemd._managers import _exec, _scope

READ_ONLY = "org.freedesktop.DBus.Error.PropertyReadOnly"
REFUSAL = "Cannot set property OOMPolicy, or unknown property."
PROPS: dict[str, tuple[str, Any]] = {"Slice": ("s", "app-agentscope-agents.slice")}


def test_asks_with_oompolicy_until_refused_then_without() -> None:
    fallback = _scope.OOMPolicyFallback()
    sent = fallback.properties(PROPS)
    assert sent["OOMPolicy"] == ("s", "continue")
    assert fallback.refused(sent, READ_ONLY, REFUSAL)
    assert "OOMPolicy" not in fallback.properties(PROPS)
    assert PROPS == {"Slice": ("s", "app-agentscope-agents.slice")}  # not changed in place


@pytest.mark.parametrize(
    ("sent", "name", "message"),
    [
        ({}, READ_ONLY, REFUSAL),  # not asked for OOMPolicy: not its refusal
        ({"OOMPolicy": ("s", "continue")}, READ_ONLY, "Cannot set property MemoryMax"),
        ({"OOMPolicy": ("s", "continue")}, "org.freedesktop.systemd1.UnitExists", REFUSAL),
    ],
)
def test_other_errors_are_not_the_refusal(
    sent: dict[str, tuple[str, Any]], name: str, message: str
) -> None:
    fallback = _scope.OOMPolicyFallback()
    assert not fallback.refused(sent, name, message)
    assert "OOMPolicy" in fallback.properties(PROPS)


def test_the_warning_is_given_once() -> None:
    fallback = _scope.OOMPolicyFallback()
    first = fallback.warning("252")
    assert first is not None
    assert first.startswith("systemd 252 refuses OOMPolicy")
    assert fallback.warning("252") is None


class FakeWire:
    """The part of _wire.Connection that _exec._run uses, answering as systemd ``version``."""

    manager = "user"

    def __init__(self, version: int) -> None:
        self.version = version
        self.sent: list[tuple[str, list[Any]]] = []

    def greet(self) -> list[tuple[int, str]]:
        return [(self.send("Hello"), "Hello")]

    def send(self, member: str, signature: str = "", body: Any = (), **_: Any) -> int:
        self.sent.append((member, [list(b) if not isinstance(b, str) else b for b in body]))
        return len(self.sent)

    def reply(self, serial: int, method: str) -> list[Any]:
        member, body = self.sent[serial - 1]
        if member == "StartTransientUnit":
            if self.version < 253 and "OOMPolicy" in dict(body[2]):
                raise BusError(method, READ_ONLY, REFUSAL)
            return ["/org/freedesktop/systemd1/job/1"]
        if member == "Get":
            return [str(self.version)]
        return [":1.5"]

    def call(self, member: str, signature: str = "", body: Any = ()) -> list[Any]:
        return self.reply(self.send(member, signature, body), member)

    def job_result(self, job: str) -> str:
        return "done"

    def starts(self) -> list[bool]:
        """For each StartTransientUnit sent: whether it asked for OOMPolicy."""
        return ["OOMPolicy" in dict(b[2]) for m, b in self.sent if m == "StartTransientUnit"]


@pytest.mark.parametrize(("version", "starts"), [(257, [True]), (252, [True, False])])
def test_exec_retries_a_refused_oompolicy_once_and_warns(version: int, starts: list[bool]) -> None:
    conn = FakeWire(version)
    warnings: list[str] = []
    _exec._run(conn, "agentscope-f-a-abcdef.scope", dict(PROPS), warnings.append)  # type: ignore[arg-type]
    assert conn.starts() == starts
    expected = [] if version >= 253 else [_scope.OOMPOLICY_WARNING % version]
    assert warnings == expected
