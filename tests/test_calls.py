"""Tool calls as cgroups of their own (#26): the call path over a fake cgroup tree.

The fake tree is :mod:`fakefs`'s (each change below holds its kernel lock,
as the fake bus reads the tree from its own task); what only the kernel does on cgroupfs
(``mkdir`` makes a cgroup with its interface files, a write to
``cgroup.procs`` moves a process, ``cgroup.subtree_control`` refuses
controllers while the cgroup holds processes, ``rmdir`` refuses a populated
cgroup) is done by :class:`FakeKernel`, in the kernel's terms
(Documentation/admin-guide/cgroup-v2.rst).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agentscope_systemd import AsyncFleet
from agentscope_systemd._calls import _calls
from agentscope_systemd._cli._call import call_command, parse_call_args
from agentscope_systemd._cli._errors import BadInput, CommandNotFound, exec_status
from agentscope_systemd._cli._options import Options
from agentscope_systemd._cli.main import hoist_globals
from agentscope_systemd._errors import AgentNotFound, InvalidConfig, InvalidName, LaunchError
from agentscope_systemd._kernel._cgroup import read_subtree_procs
from agentscope_systemd._managers._scopefiles import read_scopes
from tests.fakefs import holding_kernel, make_cgroup, make_cgroup_root
from tests.fakesystemd import FakeSystemd, end_children
from tests.test_cli_fast import imported_by
from tests.test_fleet import make_fleet, stop_everything

SLICE = "user.slice/user-1000.slice/user@1000.service/app.slice/app-agentscope-agents.slice"
UNIT = "agentscope-default-alice-1a2b3c.scope"
PID = 4242


class FakeKernel:
    """The cgroupfs semantics the call path relies on, over a fakefs tree."""

    def __init__(self, root: Path, proc: Path) -> None:
        self.root = root
        self.proc = proc

    @holding_kernel
    def mkdir(self, path: str) -> None:
        p = Path(path)
        p.mkdir()
        parent = (p.parent / "cgroup.subtree_control").read_text().split()
        (p / "cgroup.controllers").write_text(" ".join(parent) + "\n")
        (p / "cgroup.subtree_control").write_text("\n")
        (p / "cgroup.procs").write_text("")
        (p / "cgroup.events").write_text("populated 0\nfrozen 0\n")
        if "memory" in parent:
            for name in ("memory.max", "memory.swap.max"):
                (p / name).write_text("max\n")
            (p / "memory.oom.group").write_text("0\n")
        if "pids" in parent:
            (p / "pids.max").write_text("max\n")

    @holding_kernel
    def write(self, path: str, value: str) -> None:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        cg = p.parent
        if p.name == "cgroup.procs":
            pid = PID if value.strip() == "0" else int(value)
            if (cg / "cgroup.subtree_control").read_text().split():
                raise OSError(errno.EBUSY, "Device or resource busy", path)
            self._drop(pid)
            p.write_text(p.read_text() + f"{pid}\n")
            (self.proc / str(pid)).mkdir(parents=True, exist_ok=True)
            (self.proc / str(pid) / "cgroup").write_text(f"0::/{cg.relative_to(self.root)}\n")
            self._populate()
        elif p.name == "cgroup.subtree_control":
            if (cg / "cgroup.procs").read_text().split():
                raise OSError(errno.EBUSY, "Device or resource busy", path)
            have = (cg / "cgroup.controllers").read_text().split()
            enabled = set(p.read_text().split())
            for word in value.split():
                if word[1:] not in have:
                    raise OSError(errno.ENOENT, "No such file or directory", path)
                (enabled.add if word[0] == "+" else enabled.discard)(word[1:])
            p.write_text(" ".join(sorted(enabled)) + "\n")
        else:
            p.write_text(value + "\n")

    @holding_kernel
    def rmdir(self, path: str) -> None:
        p = Path(path)
        if any(c.is_dir() for c in p.iterdir()) or self._populated(p):
            raise OSError(errno.EBUSY, "Device or resource busy", path)
        shutil.rmtree(p)

    @holding_kernel
    def leave(self, pid: int) -> None:
        """``pid`` exits."""
        self._drop(pid)
        self._populate()

    def _drop(self, pid: int) -> None:
        # Only the file that lists it changes: the fake bus reads the others unlocked.
        for procs in self.root.rglob("cgroup.procs"):
            pids = procs.read_text().split()
            if str(pid) in pids:
                procs.write_text("".join(f"{q}\n" for q in pids if q != str(pid)))

    def _populated(self, cg: Path) -> bool:
        return any(f.read_text().strip() for f in cg.rglob("cgroup.procs"))

    def _populate(self) -> None:
        for events in self.root.rglob("cgroup.events"):
            text = f"populated {int(self._populated(events.parent))}\nfrozen 0\n"
            if events.read_text() != text:
                events.write_text(text)


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    root = make_cgroup_root(tmp_path / "cgroup")
    proc = tmp_path / "proc"
    k = FakeKernel(root, proc)
    monkeypatch.setattr(_calls, "_mkdir", k.mkdir)
    monkeypatch.setattr(_calls, "_write", k.write)
    monkeypatch.setattr(_calls, "_remove_cgroup", k.rmdir)
    return k


def agent_scope(kernel: FakeKernel, controllers: str = "cpu memory pids") -> Path:
    """An agent's scope as systemd starts it delegated: its one process at its root."""
    scope = make_cgroup(kernel.root, f"{SLICE}/{UNIT}", procs=[PID], controllers=controllers)
    (scope / "cgroup.subtree_control").write_text("\n")
    (scope / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    (kernel.proc / str(PID)).mkdir(parents=True)
    (kernel.proc / str(PID) / "cgroup").write_text(f"0::/{SLICE}/{UNIT}\n")
    return scope


def cgroup_of(kernel: FakeKernel, pid: int = PID) -> str:
    return (kernel.proc / str(pid) / "cgroup").read_text().strip()[3:]


def settled(kernel: FakeKernel) -> Path:
    scope = agent_scope(kernel)
    assert _calls.settle_process(PID, str(kernel.root), str(kernel.proc)) is None
    (kernel.proc / "self").symlink_to(str(PID))
    return scope


# -- the delegated scope's shape ----------------------------------------------------------


def test_settle_moves_the_agent_into_a_leaf_and_enables_memory_and_pids(
    kernel: FakeKernel,
) -> None:
    scope = agent_scope(kernel)
    assert _calls.settle_process(PID, str(kernel.root), str(kernel.proc)) is None
    assert cgroup_of(kernel) == f"/{SLICE}/{UNIT}/agent"
    assert (scope / "cgroup.procs").read_text() == ""  # no internal process
    assert (scope / "cgroup.subtree_control").read_text().split() == ["memory", "pids"]
    assert (scope / "claude-code-bash" / "memory.swap.max").read_text().strip() == "0"
    assert _calls.delegation(str(scope)) is None
    # Every reader of "the agent's processes" still finds it (the reconcile's, the reaper's).
    assert read_subtree_procs(scope) == f"{PID}\n".encode()
    live = read_scopes(scope.parent, {UNIT: ("alice", "active")})
    assert live[UNIT].pids == (PID,)


def test_without_the_memory_controller_the_agent_stays_where_it_is_and_says_why(
    kernel: FakeKernel,
) -> None:
    # A user manager whose user@.service delegates no memory controller.
    scope = agent_scope(kernel, controllers="pids")
    why = _calls.settle_process(PID, str(kernel.root), str(kernel.proc))
    assert "memory controller is not delegated" in str(why)
    assert cgroup_of(kernel) == f"/{SLICE}/{UNIT}"
    assert not (scope / "agent").exists()
    assert "memory controller is not delegated" in str(_calls.delegation(str(scope)))


def test_an_undelegated_scope_is_said_to_be_so(kernel: FakeKernel) -> None:
    scope = agent_scope(kernel)
    assert "not in an agent leaf" in str(_calls.delegation(str(scope)))


def _oomd_avoid(path: Path) -> bytes | None:
    try:
        return os.getxattr(path, "user.oomd_avoid")
    except OSError as exc:
        if exc.errno == errno.ENOTSUP:
            pytest.skip(f"no user xattrs where the fake tree is ({path})")
        return None


def test_the_agent_leaf_is_what_systemd_oomd_takes_last(kernel: FakeKernel) -> None:
    # oomd picks among leaves and oom.group cgroups, by the candidate's own
    # user.oomd_avoid (what ManagedOOMPreference=avoid writes): the agent leaf
    # carries it, its calls do not, so a call goes before its agent.
    scope = settled(kernel)
    call = _calls.create_call(str(scope), _calls.call_limits(name="make"))
    assert _oomd_avoid(scope / "agent") == b"1"
    assert _oomd_avoid(Path(call)) is None
    assert _oomd_avoid(scope / "claude-code-bash") is None  # Claude Code's tool calls


def test_a_cgroupfs_without_user_xattrs_still_gives_the_scope_its_shape(
    kernel: FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Linux before 5.7 has no user.* xattrs on cgroupfs: the leaf is then unmarked.
    def refuse(path: str, name: str, value: bytes) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported", path)

    monkeypatch.setattr(_calls, "_set_xattr", refuse)
    scope = agent_scope(kernel)
    assert _calls.settle_process(PID, str(kernel.root), str(kernel.proc)) is None
    assert cgroup_of(kernel) == f"/{SLICE}/{UNIT}/agent"
    assert (scope / "cgroup.subtree_control").read_text().split() == ["memory", "pids"]


def test_claude_codes_cgroup_beside_its_own_lands_inside_its_agent(kernel: FakeKernel) -> None:
    # CLAUDE_CODE_TOOL_MEMORY_LIMIT: dirname(/proc/self/cgroup) + "/claude-code-bash".
    settled(kernel)
    beside = os.path.dirname(cgroup_of(kernel)) + "/claude-code-bash"
    assert beside == f"/{SLICE}/{UNIT}/claude-code-bash"
    assert _calls.find_scope(beside) == (f"/{SLICE}/{UNIT}", UNIT)


# -- finding the agent ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cgroup", "why"),
    [
        ("/user.slice/user-1000.slice/session-3.scope", "session-3.scope is not an agentscope"),
        ("/system.slice/cron.service", "in no agent's scope"),
        ("/", "in no agent's scope"),
        (None, "no cgroup v2 hierarchy"),
        # A directory named like a scope but not below a slice: no agent's.
        ("/agentscope-default-alice-1a2b3c.scope", "is not an agentscope agent's scope"),
    ],
)
def test_a_call_outside_any_agent_is_refused(cgroup: str | None, why: str) -> None:
    with pytest.raises(_calls.NotInAgent, match=why):
        _calls.find_scope(cgroup)


def test_a_call_from_inside_a_call_belongs_to_the_same_agent() -> None:
    inner = f"/{SLICE}/{UNIT}/call-make-3/sub"
    assert _calls.find_scope(inner) == (f"/{SLICE}/{UNIT}", UNIT)


# -- a call's cgroup ---------------------------------------------------------------------------


def test_calls_are_numbered_per_label_and_capped(kernel: FakeKernel) -> None:
    scope = settled(kernel)
    limits = _calls.call_limits(memory_max="64M", tasks_max="32", name="make")
    first = Path(_calls.create_call(str(scope), limits))
    second = Path(_calls.create_call(str(scope), limits))
    assert (first.name, second.name) == ("call-make-1", "call-make-2")
    assert (first / "memory.max").read_text().strip() == str(64 << 20)
    assert (first / "memory.swap.max").read_text().strip() == "0"
    assert (first / "pids.max").read_text().strip() == "32"
    assert (first / "memory.oom.group").read_text().strip() == "1"
    other = Path(_calls.create_call(str(scope), _calls.call_limits()))
    assert other.name == "call-cmd-1"
    assert (other / "memory.max").read_text().strip() == "max"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"memory_max": "-1"}, InvalidConfig),
        ({"memory_max": "0"}, InvalidConfig),
        ({"memory_max": "lots"}, InvalidConfig),
        ({"memory_swap_max": "9E"}, InvalidConfig),
        ({"tasks_max": "0"}, InvalidConfig),
        ({"tasks_max": "1.5"}, InvalidConfig),
        ({"tasks_max": "99999999"}, InvalidConfig),
        ({"name": "../etc"}, InvalidName),
        ({"name": "-x"}, InvalidName),
        ({"name": "a" * 65}, InvalidName),
    ],
)
def test_bad_caps_are_refused_before_anything_is_made(
    kernel: FakeKernel, kwargs: dict[str, str], error: type[Exception]
) -> None:
    scope = settled(kernel)
    before = sorted(p.name for p in scope.iterdir())
    ran: list[str] = []
    with pytest.raises(error) as info:
        call_command(
            Options(),
            ["true"],
            execv=lambda path, argv: ran.append(path),
            cgroup_root=str(kernel.root),
            proc_root=str(kernel.proc),
            **kwargs,
        )
    assert exec_status(info.value) == 125
    assert sorted(p.name for p in scope.iterdir()) == before
    assert ran == []


def test_call_moves_itself_into_a_new_call_and_execs(
    kernel: FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    scope = settled(kernel)
    removers: list[str] = []
    monkeypatch.setattr(_calls, "fork_remover", lambda path, watch: removers.append(path))
    ran: list[tuple[str, list[str]]] = []
    call_command(
        Options(),
        ["true", "x"],
        memory_max="1G",
        name="build",
        execv=lambda path, argv: ran.append((path, argv)),
        cgroup_root=str(kernel.root),
        proc_root=str(kernel.proc),
    )
    assert cgroup_of(kernel) == f"/{SLICE}/{UNIT}/call-build-1"
    assert removers == [str(scope / "call-build-1")]
    assert ran == [(shutil.which("true"), ["true", "x"])]


def test_call_outside_an_agent_exits_125_and_makes_nothing(
    kernel: FakeKernel, tmp_path: Path
) -> None:
    (kernel.proc / "self").mkdir(parents=True)
    (kernel.proc / "self" / "cgroup").write_text("0::/user.slice/user-1000.slice/session-2.scope\n")
    with pytest.raises(_calls.NotInAgent) as info:
        call_command(
            Options(),
            ["true"],
            execv=lambda path, argv: None,
            cgroup_root=str(kernel.root),
            proc_root=str(kernel.proc),
        )
    assert "session-2.scope is not an agentscope agent's scope" in str(info.value)
    assert exec_status(info.value) == 125


def test_call_in_an_undelegated_agent_runs_uncapped_and_says_why(
    kernel: FakeKernel, capsys: pytest.CaptureFixture[str]
) -> None:
    scope = agent_scope(kernel)
    (kernel.proc / "self").symlink_to(str(PID))
    ran: list[str] = []
    call_command(
        Options(),
        ["true"],
        memory_max="1G",
        execv=lambda path, argv: ran.append(path),
        cgroup_root=str(kernel.root),
        proc_root=str(kernel.proc),
    )
    assert ran
    assert cgroup_of(kernel) == f"/{SLICE}/{UNIT}"
    assert not [p for p in scope.iterdir() if p.name.startswith("call-")]
    err = capsys.readouterr().err
    assert f"calls are not isolated in {UNIT}" in err
    assert "without the call's caps" in err


def test_a_missing_command_is_127_before_anything_is_made(kernel: FakeKernel) -> None:
    scope = settled(kernel)
    with pytest.raises(CommandNotFound) as info:
        call_command(
            Options(),
            ["no-such-command-here"],
            cgroup_root=str(kernel.root),
            proc_root=str(kernel.proc),
        )
    assert exec_status(info.value) == 127
    assert not [p for p in scope.iterdir() if p.name.startswith("call-")]


@pytest.mark.parametrize(
    ("args", "values", "cmd"),
    [
        (["--", "make", "-j8"], {}, ["make", "-j8"]),
        (["--memory-max=2G", "make", "--name", "x"], {"memory_max": "2G"}, ["make", "--name", "x"]),
        (["--name", "b", "--tasks-max", "9", "--", "sh"], {"name": "b", "tasks_max": "9"}, ["sh"]),
    ],
)
def test_call_arguments(args: list[str], values: dict[str, str], cmd: list[str]) -> None:
    assert parse_call_args(args) == (values, cmd)


@pytest.mark.parametrize(
    "args", [[], ["--"], ["--bogus", "x"], ["--name"], ["--name", "a", "--name", "b", "x"]]
)
def test_bad_call_usage(args: list[str]) -> None:
    with pytest.raises(BadInput):
        parse_call_args(args)


# -- cleanup -----------------------------------------------------------------------------------


def test_a_calls_cgroup_goes_once_it_is_empty_and_nothing_accumulates(kernel: FakeKernel) -> None:
    scope = settled(kernel)
    for n in range(40):
        call = _calls.create_call(str(scope), _calls.call_limits())
        _calls.enter(call)
        assert _calls.populated(call) is True
        kernel.write(str(scope / "agent" / "cgroup.procs"), str(PID))  # the call ended
        _calls.remove_when_empty(call, poll_interval=0.01)
        assert not os.path.exists(call), n
    assert sorted(p.name for p in scope.iterdir() if p.is_dir()) == ["agent", "claude-code-bash"]


def test_sweep_removes_empty_calls_only(kernel: FakeKernel) -> None:
    scope = settled(kernel)
    busy = _calls.create_call(str(scope), _calls.call_limits(name="busy"))
    idle = _calls.create_call(str(scope), _calls.call_limits(name="idle"))
    _calls.enter(busy)
    assert _calls.sweep(str(scope)) == [os.path.basename(idle)]
    assert os.path.isdir(busy)


# -- the fake bus: Delegate asked for, and what happens where it cannot be used ---------------


async def test_launch_asks_for_a_delegated_scope_and_says_once_when_calls_are_not_isolated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_calls, "_SAID", set())
    bus = FakeSystemd(tmp_path / "cgroup")
    caplog.set_level(logging.WARNING, "agentscope")
    async with make_fleet(tmp_path, bus) as fleet:
        for name in ("a", "b"):
            await fleet.launch(name, ["sleep", "30"])
        starts = [c for c in bus.calls if c.member == "StartTransientUnit"]
        assert [dict((k, v.value) for k, v in c.body[2]).get("Delegate") for c in starts] == [
            True,
            True,
        ]
        await stop_everything(bus)
    end_children()
    # The fake bus starts a scope as a plain directory of the fake tree; the
    # child's real /proc/PID/cgroup is not in it, so no leaf can be made:
    # the agent runs as in an undelegated scope, and that is said once.
    said = [r.getMessage() for r in caplog.records if "not isolated" in r.getMessage()]
    assert len(said) == 1, said
    assert "docs/calls.md" in said[0]


# -- Fleet.call ----------------------------------------------------------------------------------


async def delegated_agent(fleet: AsyncFleet, bus: FakeSystemd, name: str) -> Path:
    """Launch ``name`` on the fake bus and give its scope a delegated scope's shape; the scope."""
    agent = await fleet.launch(name, ["sleep", "30"])
    scope = bus.units[agent.unit].cgroup
    (scope / "cgroup.subtree_control").write_text("\n")
    (scope / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    assert _calls.settle(str(scope), agent.pid) is None  # as on a delegated scope
    # The fake bus knows no leaves: it collects a scope whose own cgroup.procs is empty.
    (scope / "cgroup.procs").write_text(f"{agent.pid}\n")
    return Path(scope)


async def test_fleet_call_runs_in_a_new_call_of_the_named_agent(
    tmp_path: Path, kernel: FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_calls, "_SAID", set())
    bus = FakeSystemd(tmp_path / "cgroup")
    async with make_fleet(tmp_path, bus) as fleet:
        scope = await delegated_agent(fleet, bus, "a")
        call = await fleet.call("a", ["true"], memory_max="64M", tasks_max=8, name="t")
        assert call.cgroup == str(scope / "call-t-1")
        assert (scope / "call-t-1" / "cgroup.procs").read_text().split() == [str(call.pid)]
        assert (scope / "call-t-1" / "memory.max").read_text().strip() == str(64 << 20)
        assert (scope / "call-t-1" / "pids.max").read_text().strip() == "8"
        assert await call.wait() == 0
        kernel.leave(call.pid)  # the kernel empties the call: its remover takes it away
        for _ in range(400):  # 20 s: 5 s was not enough beside two TCG VMs on a slow day
            if not (scope / "call-t-1").exists():
                break
            await asyncio.sleep(0.05)
        assert not (scope / "call-t-1").exists()
        with pytest.raises(AgentNotFound):
            await fleet.call("nobody", ["true"])
        with pytest.raises(InvalidConfig):
            await fleet.call("a", ["true"], memory_max="-5")
        assert sorted(p.name for p in scope.iterdir() if p.is_dir()) == [
            "agent",
            "claude-code-bash",
        ]
        await stop_everything(bus)
    end_children()


async def test_fleet_call_in_an_undelegated_agent_is_refused_with_why(tmp_path: Path) -> None:
    bus = FakeSystemd(tmp_path / "cgroup")
    async with make_fleet(tmp_path, bus) as fleet:
        agent = await fleet.launch("a", ["sleep", "30"])
        with pytest.raises(LaunchError, match="calls are not isolated in agent a"):
            await fleet.call("a", ["true"])
        assert not [p for p in bus.units[agent.unit].cgroup.iterdir() if p.is_dir()]
        await stop_everything(bus)
    end_children()


def test_call_starts_without_typer_asyncio_dbus_or_sqlite(tmp_path: Path) -> None:
    result, modules = imported_by(tmp_path, "call", "--memory-max", "1G", "--", "true")
    assert result["code"] == 125, result  # this host's process is in no agent
    assert "is in no agent's scope" in result["stderr"] or "not an agentscope" in result["stderr"]
    heavy = {"typer", "click", "rich", "asyncio", "dbus_fast", "sqlite3", "logging", "psutil"}
    assert {m.partition(".")[0] for m in modules} & heavy == set()
    assert "agentscope_systemd._cli._app" not in modules


@pytest.mark.parametrize(
    ("args", "hoisted"),
    [
        (["call", "--name", "x", "make", "--json"], ["call", "--name", "x", "make", "--json"]),
        (["call", "--json", "--", "make", "--json"], ["--json", "call", "--", "make", "--json"]),
    ],
)
def test_options_after_calls_command_are_the_commands(args: list[str], hoisted: list[str]) -> None:
    assert hoist_globals(args) == hoisted


def test_a_calls_leftovers_end_with_it_term_first(kernel: FakeKernel) -> None:
    scope = settled(kernel)
    call = _calls.create_call(str(scope), _calls.call_limits())
    polite = subprocess.Popen(["sleep", "60"])
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"])
    agents = subprocess.Popen(["sleep", "60"])
    try:
        kernel.write(call + "/cgroup.procs", str(polite.pid))
        kernel.write(call + "/cgroup.procs", str(stubborn.pid))
        kernel.write(str(scope / "agent" / "cgroup.procs"), str(agents.pid))
        time.sleep(0.2)  # the trap is set
        # The fake tree does not empty itself: each signal goes out, TERM then KILL.
        assert _calls.end_leftovers(call, str(kernel.proc), grace=0.1, term=0.5) == 2
        assert polite.wait(10) == -signal.SIGTERM
        assert stubborn.wait(10) == -signal.SIGKILL
        assert agents.poll() is None  # the agent's leaf is not the call's
    finally:
        for p in (polite, stubborn, agents):
            p.kill()
            p.wait()
    kernel.leave(polite.pid)
    kernel.leave(stubborn.pid)
    assert _calls.end_leftovers(call, str(kernel.proc), grace=0.1) == 0  # empty: nothing to do


# -- an agent's call defaults, given at its launch ---------------------------------------------


def test_a_call_naming_no_cap_takes_its_agents_defaults(
    kernel: FakeKernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    scope = settled(kernel)
    monkeypatch.setattr(_calls, "fork_remover", lambda path, watch: None)
    monkeypatch.setenv("AGENTSCOPE_CALL_MEMORY_MAX", str(1 << 30))
    monkeypatch.setenv("AGENTSCOPE_CALL_TASKS_MAX", "64")
    run = {"execv": lambda path, argv: None, "cgroup_root": str(kernel.root)}
    call_command(Options(), ["true"], proc_root=str(kernel.proc), **run)  # type: ignore[arg-type]
    assert (scope / "call-cmd-1" / "memory.max").read_text().strip() == str(1 << 30)
    assert (scope / "call-cmd-1" / "pids.max").read_text().strip() == "64"
    call_command(Options(), ["true"], memory_max="2G", proc_root=str(kernel.proc), **run)  # type: ignore[arg-type]
    assert (scope / "call-cmd-2" / "memory.max").read_text().strip() == str(2 << 30)
    monkeypatch.setenv("AGENTSCOPE_CALL_TASKS_MAX", "lots")
    with pytest.raises(InvalidConfig):
        call_command(Options(), ["true"], proc_root=str(kernel.proc), **run)  # type: ignore[arg-type]
    assert not (scope / "call-cmd-3").exists()


async def test_launch_gives_the_agent_its_calls_defaults(tmp_path: Path) -> None:
    bus = FakeSystemd(tmp_path / "cgroup")
    out = tmp_path / "env"
    async with make_fleet(tmp_path, bus) as fleet:
        with pytest.raises(InvalidConfig):
            await fleet.launch("bad", ["true"], call_memory_max="-1")
        assert await fleet.agents() == []
        agent = await fleet.launch(
            "a",
            ["sh", "-c", f'echo "$AGENTSCOPE_CALL_MEMORY_MAX $AGENTSCOPE_CALL_TASKS_MAX" > {out}'],
            call_memory_max="512M",
            call_tasks_max=32,
        )
        assert await agent.wait() == 0
        await stop_everything(bus)
    end_children()
    assert out.read_text().split() == [str(512 << 20), "32"]
