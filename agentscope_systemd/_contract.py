"""The JSON contract: the shapes ``--json`` prints and their versions; one event shape.

Every JSON output names its shape and version in a ``schema`` field
(``"agentscope.event/1"``), described by ``schemas/<shape>.json`` (JSON
Schema 2020-12; installed as ``agentscope_systemd/_schemas``). The rule
(docs/json.md): a field added keeps the version, a field removed, renamed
or retyped bumps it. The versions live here and nowhere else.

An event has one shape wherever it comes from: ``monitor --json`` prints a
monitor event as it happens, ``events --json`` the registry's record of it,
and both are :func:`event_envelope`'s dict. No I/O here, standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final, Protocol

__all__ = [
    "VERSIONS",
    "agent_list",
    "error_body",
    "event_envelope",
    "event_parts",
    "json_line",
    "load_schemas",
    "monitor_event_dict",
    "schema_dir",
    "schema_id",
    "stamped",
]

#: Every shape of the contract and its version (one file each in schemas/).
VERSIONS: Final[Mapping[str, int]] = {
    "agent": 1,
    "attach": 1,
    "demo": 1,
    "doctor": 1,
    "error": 1,
    "event": 1,
    "gc": 1,
    "health": 1,
    "install": 1,
    "kill": 1,
    "launched": 1,
    "log_line": 1,
    "logs": 1,
    "report": 1,
    "send": 1,
    "state": 1,
    "stop": 1,
    "top": 1,
    "version": 1,
}

# Envelope keys of an event: never part of its detail.
_ENVELOPE = ("kind", "ts", "agent")


class _MonitorEvent(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


def schema_id(shape: str) -> str:
    """The ``schema`` field of a shape: ``agentscope.<shape>/<version>``.

    Raises:
        KeyError: not a shape of the contract.
    """
    return f"agentscope.{shape}/{VERSIONS[shape]}"


def stamped(shape: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with its ``schema`` field first."""
    return {"schema": schema_id(shape), **data}


def agent_list(agents: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What ``ls --json`` prints (and ``GET /v1/agents`` serves): an array, each agent stamped."""
    return [stamped("agent", agent) for agent in agents]


def error_body(message: str, kind: str) -> dict[str, Any]:
    """A failure as the contract has it: ``--json``'s stderr line, the read API's 4xx body."""
    return stamped("error", {"error": message, "kind": kind})


def json_line(data: Any) -> str:
    """One JSON document on one line, as every ``--json`` output and JSON Lines stream has it.

    ``default=str``: a value JSON has no type for (a path) is written as its text.
    """
    return json.dumps(data, default=str)


def event_envelope(
    *,
    id: int | None,
    ts: float,
    fleet: str,
    agent: str | None,
    kind: str,
    detail: Mapping[str, Any],
) -> dict[str, Any]:
    """An event as the contract has it; ``id`` None until the registry recorded it."""
    return {
        "schema": schema_id("event"),
        "id": id,
        "ts": ts,
        "fleet": fleet,
        "agent": agent,
        "kind": kind,
        "detail": dict(detail),
    }


def event_parts(event: _MonitorEvent) -> tuple[str | None, str, float, dict[str, Any]]:
    """A monitor event as (agent, kind, ts, detail): what the registry records of it."""
    data = event.to_dict()
    agent = data.get("agent")
    detail = {k: v for k, v in data.items() if k not in _ENVELOPE}
    return (agent if isinstance(agent, str) else None), str(data["kind"]), float(data["ts"]), detail


def monitor_event_dict(fleet: str, event: _MonitorEvent) -> dict[str, Any]:
    """A monitor event in the contract's event shape, before it is recorded (``id`` None)."""
    agent, kind, ts, detail = event_parts(event)
    return event_envelope(id=None, ts=ts, fleet=fleet, agent=agent, kind=kind, detail=detail)


def schema_dir() -> Path:
    """Where the schemas are: ``_schemas`` here once installed, ``schemas/`` in a checkout."""
    installed = Path(__file__).with_name("_schemas")
    return installed if installed.is_dir() else Path(__file__).parent.parent / "schemas"


def load_schemas(directory: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every schema file below ``directory`` (default :func:`schema_dir`), by its ``$id``."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((directory or schema_dir()).rglob("*.json")):
        schema = json.loads(path.read_text(encoding="utf-8"))
        found[schema["$id"]] = schema
    return found
