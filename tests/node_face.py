"""The real read API and the real CLI's --json, over the fake manager, for the Node client's tests.

``python -m tests.node_face serve``: a real ``agentscope_systemd.Fleet`` on the fake
systemd manager and cgroup tree (tests/fakesystemd.py) with agents ``a`` and
``b``, sampled as the monitor samples it, served by the monitor's face on
loopback TCP and on a Unix socket. Prints one JSON line (``url``,
``socket``), then takes commands on stdin, one a line:

- ``kill NAME``: ``agentscope kill NAME --signal CONT`` (a ``signalled``
  event, recorded by another registry connection, as a CLI's would be);
- ``sample``: sample the fleet again;

and ends (agents, face, files) at end of input.

``python -m tests.node_face record DIR``: the CLI's own ``--json`` outputs for
the same fleet written to DIR, the fixtures of clients/node/test/
(tests/test_node_client.py checks them against the schemas).
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentscope_systemd
from agentscope_systemd._cli import _fleet
from agentscope_systemd._cli._cmd_monitor import _sample
from agentscope_systemd._cli._http import FaceState, start_face
from agentscope_systemd._cli._options import Options
from tests.fakefleet import fake_fleet
from tests.test_cli import run


@contextlib.contextmanager
def _fleet_under(root: Path) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch, fake_fleet(root, patch):
        yield


def cli(*args: str) -> tuple[int, str, str]:
    result = run("--manager", "user", "--json", *args)
    return result.code, result.stdout, result.stderr


def _launch_two() -> str:
    cli("run", "a", "--", "sleep", "600")
    code, out, err = cli("run", "b", "--memory-max", "1G", "--", "sleep", "600")
    assert code == 0, err
    return out


def record(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, _fleet_under(Path(tmp)):
        outputs = {"run.json": _launch_two()}
        cli("kill", "a", "--signal", "CONT")
        outputs["ls.json"] = cli("ls")[1]
        outputs["report.json"] = cli("report", "--top", "2")[1]
        outputs["stop.json"] = cli("stop", "a", "--timeout", "1")[1]
        outputs["events.jsonl"] = cli("events")[1]
        code, _, err = cli("stop", "nosuch")
        assert code == 3
        outputs["error-not-found.json"] = err
        for name, text in outputs.items():
            (directory / name).write_text(text)


def serve() -> None:
    with tempfile.TemporaryDirectory() as tmp, _fleet_under(Path(tmp)):
        root = Path(tmp)
        _launch_two()
        fleet = _fleet.open_fleet(Options(manager="user"))
        state = FaceState("default", "user", period=2.0, version=agentscope_systemd.__version__)
        _sample(fleet, state)
        tcp = start_face(("127.0.0.1", 0), state, fleet)
        unix = start_face(str(root / "monitor.sock"), state, fleet)
        try:
            print(json.dumps({"url": tcp.url, "socket": unix.address}), flush=True)
            for line in sys.stdin:
                command, _, arg = line.strip().partition(" ")
                if command == "kill":
                    code, _, err = cli("kill", arg, "--signal", "CONT")
                    print(json.dumps({"done": command, "code": code, "error": err}), flush=True)
                elif command == "sample":
                    _sample(fleet, state)
                    print(json.dumps({"done": command}), flush=True)
        finally:
            tcp.close()
            unix.close()
            fleet.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["record"] and len(sys.argv) == 3:
        record(Path(sys.argv[2]))
    elif sys.argv[1:] == ["serve"]:
        serve()
    else:
        sys.exit("usage: python -m tests.node_face serve | record DIR")
