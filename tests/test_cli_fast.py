"""The command line starts fast: each command imports what it uses, and no more.

``--version`` is answered before typer is imported; a command imports its own
module only; typer 0.29's pydantic converters are built only for a value the
plain converter cannot take (issue 28). benchmarks/bench_cli.py --host
measures the start-up; these tests hold the imports that make it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st

import agentscope_systemd
from agentscope_systemd._cli import _app, _typerfast
from tests.test_cli import FakeFleet, fleet, run  # noqa: F401 (fleet: the fixture)

ROOT = Path(__file__).resolve().parent.parent

# Never needed to print JSON from the registry, nor to start a command.
_HEAVY = {"rich", "pydantic", "asyncio", "dbus_fast", "psutil"}
_OTHER_COMMANDS = {
    "agentscope_systemd._cli._cmd_admin",
    "agentscope_systemd._cli._doctor",
    "agentscope_systemd._cli._http",
    "agentscope_systemd._cli._demo",
    "agentscope_systemd._cli._top",
}
# What only a monitor, a guard, a report or a tool call runs: listing a fleet
# opens it (the bus, the registry, recovery) and runs none of them.
_MONITOR = {
    "agentscope_systemd._monitor._monitor",
    "agentscope_systemd._monitor._logwatch",
    "agentscope_systemd._monitor._sampling",
    "agentscope_systemd._monitor._killcount",
    "agentscope_systemd._guard._guard",
    "agentscope_systemd._guard._guardthread",
    "agentscope_systemd._guard._guardbase",
    "agentscope_systemd._guard._guardpolicy",
    "agentscope_systemd._guard._guardscan",
    "agentscope_systemd._monitor._report",
    "agentscope_systemd._calls._callrun",
}
# What a fleet on systemd opened with nothing to recover never runs: the
# monitor's events (made for a kill found), the kernel log's parsers (for a
# log with new lines), the other modes' managers (for their mode only),
# tempfile (for a tmux server's start only).
_OPEN_UNUSED = {
    "tempfile",
    "agentscope_systemd._events",
    "agentscope_systemd._guard._guardevents",
    "agentscope_systemd._monitor._attribution",
    "agentscope_systemd._managers._cgroupmode",
    "agentscope_systemd._managers._procscopes",
    "agentscope_systemd._kernel._proctrees",
}


def imported_by(tmp_path: Path, *args: str) -> tuple[dict[str, Any], set[str]]:
    """What ``agentscope ARGS`` printed and every module it imported, in a fresh process."""
    code = textwrap.dedent(
        f"""
        import json, sys
        from agentscope_systemd._cli.main import main
        try:
            main({list(args)!r})
        except SystemExit as exc:
            code = exc.code
        sys.stdout.flush()
        sys.stderr.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n")
        sys.exit(code)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={
            **os.environ,
            "XDG_STATE_HOME": str(tmp_path / "state"),
            "XDG_RUNTIME_DIR": str(tmp_path / "run"),
            "DBUS_SESSION_BUS_ADDRESS": "garbage",
            "COLUMNS": "100",
        },
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    err, _, modules = done.stderr.rpartition("MODULES ")
    result = {"code": done.returncode, "stdout": done.stdout, "stderr": err.strip()}
    return result, set(json.loads(modules))


def _tops(modules: set[str]) -> set[str]:
    return {m.partition(".")[0] for m in modules}


def test_version_imports_neither_typer_nor_rich(tmp_path: Path) -> None:
    result, modules = imported_by(tmp_path, "--version")
    assert (result["code"], result["stdout"]) == (
        0,
        f"agentscope {agentscope_systemd.__version__}\n",
    )
    assert _tops(modules) & {"typer", "click", *_HEAVY} == set()
    assert "agentscope_systemd._cli._app" not in modules
    result, modules = imported_by(tmp_path, "--user", "--version", "--json")
    assert json.loads(result["stdout"]) == {
        "schema": "agentscope.version/1",
        "version": agentscope_systemd.__version__,
    }
    assert "typer" not in _tops(modules)


@pytest.mark.parametrize(
    "args",
    [["--version", "ls"], ["--version", "--bogus"], ["--fleet", "--version"]],
    ids=["command", "unknown-option", "fleet-takes-it"],
)
def test_version_with_more_is_typers_to_answer(tmp_path: Path, args: list[str]) -> None:
    # What --version means next to other words is typer's: the quick answer
    # is only for the global options and --version alone.
    result, modules = imported_by(tmp_path, *args)
    assert "typer" in _tops(modules)
    if args[0] == "--version" and args[1] == "ls":
        assert result["code"] == 0
        assert result["stdout"] == f"agentscope {agentscope_systemd.__version__}\n"
    elif args[1] == "--bogus":
        assert result["code"] == 2
        assert "No such option: --bogus" in result["stderr"]


def test_events_json_imports_no_typer_no_rich_no_bus_no_other_command(tmp_path: Path) -> None:
    for args in (["--json", "events"], ["events", "--json", "--limit", "5", "--since", "-1h"]):
        result, modules = imported_by(tmp_path, "--user", *args)
        assert result["code"] == 0, result
        # Its plain command lines are read without typer (agentscope_systemd/_cli/_direct.py).
        assert _tops(modules) & {*_HEAVY, "typer", "click"} == set()
        assert (
            modules
            & {
                *_OTHER_COMMANDS,
                "agentscope_systemd._cli._cmd_agents",
                "agentscope_systemd._cli._render",
                *_MONITOR,
            }
            == set()
        )


def test_ls_and_stop_import_no_typer_no_rich_no_monitor_nor_other_command(
    tmp_path: Path,
) -> None:
    result, modules = imported_by(tmp_path, "--user", "--json", "ls")
    assert result["code"] == 4, result  # no manager here: it got as far as the bus
    assert json.loads(result["stderr"])["kind"] == "systemd_unavailable"
    assert _tops(modules) & {"rich", "pydantic", "typer", "click"} == set()
    assert (
        modules
        & {
            *_OTHER_COMMANDS,
            "agentscope_systemd._cli._cmd_monitor",
            "agentscope_systemd._cli._render",
            "agentscope_systemd._cli._app",
        }
        == set()
    )
    assert modules & _MONITOR == set()
    assert modules & _OPEN_UNUSED == set()
    assert "psutil" not in _tops(modules)  # only adopting a process tree walks it
    # stop and kill, what a harness calls next most: no typer, no monitor either.
    result, modules = imported_by(tmp_path, "--user", "stop", "builder-1", "--json")
    assert result["code"] == 4, result
    assert _tops(modules) & {"rich", "pydantic", "typer", "click"} == set()
    assert (
        modules
        & {
            *_MONITOR,
            *_OPEN_UNUSED,
            "agentscope_systemd._cli._app",
            "agentscope_systemd._cli._cmd_agents",
        }
        == set()
    )
    result, modules = imported_by(tmp_path, "--user", "kill", "builder-1", "-s", "KILL")
    assert result["code"] == 4, result
    assert _tops(modules) & {"rich", "pydantic", "typer", "click"} == set()
    result, modules = imported_by(tmp_path, "--user", "ls", "--bogus")
    assert result["code"] == 2  # what the direct path does not read is typer's to refuse
    assert "No such option: --bogus" in result["stderr"]


def test_help_lists_every_command_in_its_order(tmp_path: Path) -> None:
    result, modules = imported_by(tmp_path, "--help")
    assert result["code"] == 0
    commands = result["stdout"].partition("\nCommands:\n")[2].partition("\n\n")[0]
    listed = [line.split()[0] for line in commands.splitlines() if line.startswith("  ")]
    assert listed == list(_app.COMMANDS)
    group = typer.main.get_command(_app.app)
    for name in _app.COMMANDS:
        summary = group.commands[name].get_short_help_str(limit=300)  # type: ignore[attr-defined]
        assert summary.split()[0] in result["stdout"], name
    assert "pydantic" not in _tops(modules)


def test_a_command_is_built_only_when_asked_for() -> None:
    group = typer.main.get_command(_app.app)
    commands = group.commands  # type: ignore[attr-defined]
    assert list(commands) == list(_app.COMMANDS)
    assert commands._built == {}  # listing the names built nothing
    assert commands["ls"].name == "ls"
    assert set(commands._built) == {"ls"}


# -- the quick converters give typer's own values ----------------------------------------

_SLOW = hasattr(typer.core, "build_runtime_param")


def _params() -> list[tuple[str, Any]]:
    group = typer.main.get_command(_app.app)
    out = [("", p) for p in group.params]
    for name in _app.COMMANDS:
        out += [(name, p) for p in group.commands[name].params]  # type: ignore[attr-defined]
    return [(n, p) for n, p in out if hasattr(p, "type_descriptor")]


PARAMS = _params()
_TEXT = st.one_of(
    st.from_regex(r"-?[0-9]{0,20}(\.[0-9]{0,20})?", fullmatch=True),
    st.from_regex(r"[ +\-]?[0-9_.eE]{1,8}[ ]?", fullmatch=True),
    st.sampled_from(["user", "system", "USER", "auto", "inf", "nan", "1e3", "0x10", "٣", "¹"]),
    st.text(max_size=6),
)


def _slow_value(param: Any, value: Any) -> tuple[str, Any]:
    slow = typer.core.build_runtime_param(param.type_descriptor)  # type: ignore[attr-defined]
    ctx = param_ctx(param)
    try:
        return "ok", slow.coerce(value, param=param, ctx=ctx)
    except Exception as exc:
        return "error", type(exc).__name__


def param_ctx(param: Any) -> Any:
    command = typer.main.get_command(_app.app)
    return command.context_class(command)


@pytest.mark.skipif(not _SLOW, reason="this typer converts through click's types")
@pytest.mark.parametrize(("command", "param"), PARAMS, ids=[f"{c}:{p.name}" for c, p in PARAMS])
@settings(max_examples=60, deadline=None)
@given(text=_TEXT)
def test_the_quick_converter_gives_typers_value_or_leaves_it_to_typer(
    command: str, param: Any, text: str
) -> None:
    descriptor = param.type_descriptor
    value: Any = [text, text] if param.multiple or param.nargs == -1 else text
    quick = _typerfast.quick_value(descriptor.annotation, descriptor.parameter_info, value)
    if quick is _typerfast.UNKNOWN:
        return
    outcome, slow = _slow_value(param, value)
    assert outcome == "ok", (command, param.name, text, slow)
    assert type(quick) is type(slow)
    assert quick == slow, (command, param.name, text)


@pytest.mark.skipif(not _SLOW, reason="this typer converts through click's types")
@pytest.mark.parametrize(("command", "param"), PARAMS, ids=[f"{c}:{p.name}" for c, p in PARAMS])
def test_every_default_is_converted_quickly_and_as_typer_does(command: str, param: Any) -> None:
    default = param.default
    if default is None or callable(default):
        return
    descriptor = param.type_descriptor
    quick = _typerfast.quick_value(descriptor.annotation, descriptor.parameter_info, default)
    assert quick is not _typerfast.UNKNOWN, (command, param.name, default)
    assert (quick, type(quick)) == (_slow_value(param, default)[1], type(quick))


@pytest.mark.parametrize(
    "args",
    [
        ["report", "--top", "many"],
        ["report", "--top", "-1"],
        ["report", "--top", " 5"],
        ["stop", "a", "--timeout", "nan"],
        ["top", "--interval", "0.01"],
        ["--manager", "bogus", "ls"],
        ["--json", "events", "--limit", "1.5"],
        ["ls"],
    ],
)
def test_what_a_value_does_is_what_typer_alone_does(
    fleet: FakeFleet,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
) -> None:
    quick = run(*args)
    monkeypatch.setattr(_typerfast, "quick_value", lambda *a: _typerfast.UNKNOWN)
    slow = run(*args)
    assert (quick.code, quick.stdout, quick.stderr) == (slow.code, slow.stdout, slow.stderr)


@pytest.mark.parametrize(
    ("args", "answer"),
    [
        (["--version"], False),
        (["--json", "--version"], True),
        (["--version", "--user", "--fleet=x", "--manager", "system"], False),
        (["--fleet", "--json", "--version"], False),  # "--json" is the fleet's name there
        (["--fleet", "--version"], None),  # the fleet is named "--version": typer's to refuse
        (["--version", "ls"], None),
        (["--version", "--bogus"], None),
        (["--version", "-h"], None),
        ([], None),
    ],
)
def test_the_quick_version_answers_only_what_typer_would_answer_alike(
    args: list[str], answer: bool | None
) -> None:
    from agentscope_systemd._cli.main import version_only

    assert version_only(args) is answer


_OPEN_TWICE = """
import asyncio, json, sys
from pathlib import Path

from agentscope_systemd import AsyncFleet
from agentscope_systemd._kernel._cgroup import MemoryEvents
from tests import fakefs
from tests.fakesystemd import FakeSystemd

tmp = Path(sys.argv[1])
bus = FakeSystemd(tmp / "cgroup")
fakefs.make_cgroup(bus.cgroup_root, str(bus.slice_dir.relative_to(bus.cgroup_root)))


async def open_and_list() -> dict:
    fleet = AsyncFleet(
        "ci",
        registry=tmp / "registry.db",
        manager_oom_score_adj=None,
        tmux_dir=tmp / "tmux",
        _bus=bus,
    )
    fleet._recovery.kmsg_path, fleet._recovery.read_journal = None, False
    async with fleet:
        await fleet.agents()
        kills = await fleet.events(kind="oom_kill")
    return {"kills": len(kills), "modules": sorted(sys.modules)}


first = asyncio.run(open_and_list())
with fakefs.KERNEL:  # a kill in a scope gone since: only the slice counted it
    fakefs.write(
        bus.slice_dir / "memory.events", fakefs.format_memory_events(MemoryEvents(0, 0, 0, 1, 1))
    )
second = asyncio.run(open_and_list())
print(json.dumps([first, second]))
"""


def test_an_open_with_nothing_to_recover_skips_the_events_and_the_log_parsers(
    tmp_path: Path,
) -> None:
    # What `ls` pays at open (issue 28): the monitor's events module is
    # imported for a kill found only, the kernel log's parsers for new lines
    # only. A kill while no monitor ran is still recovered, and then they load.
    done = subprocess.run(
        [sys.executable, "-c", _OPEN_TWICE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=True,
    )
    first, second = json.loads(done.stdout)
    assert first["kills"] == 0
    assert set(first["modules"]) & _OPEN_UNUSED == set()
    assert second["kills"] == 1  # recovered at the next open, as before
    assert "agentscope_systemd._events" in second["modules"]
