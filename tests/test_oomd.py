"""systemd-oomd: its settings read, the rules over the agents judged, its kill lines named."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentscope_systemd import OomdKill
from agentscope_systemd._cli import _doctor
from agentscope_systemd._contract import monitor_event_dict
from agentscope_systemd._kernel._journal import follow_argv
from agentscope_systemd._monitor import _logwatch
from agentscope_systemd._monitor._monitor import Monitor
from agentscope_systemd._monitor._oomd import (
    MAX_LINE,
    OOMD_DEFAULTS,
    OomdConfig,
    OomdRepeats,
    UnitRules,
    _percent,
    _timespan,
    agents_ancestors,
    assess_oomd,
    oomd_kill_event,
    oomd_state,
    parse_oomd_conf,
    parse_oomd_line,
    parse_unit_rules,
    read_oomd_chain,
    read_oomd_config,
)
from tests.fakefs import (
    format_pressure,
    make_cgroup,
    make_cgroup_root,
    make_host_pressure,
    make_meminfo,
)
from tests.fakesystemd import FakeSystemd, FakeUnit
from tests.test_contract import validate

SLICE = "app-agentscope-agents.slice"
USER_SLICE = "/user.slice/user-1000.slice/user@1000.service/app.slice/app-agentscope.slice/" + SLICE
UNIT = "agentscope-default-coder-3f9a2c.scope"
HALF = 1 << 31  # ManagedOOMMemoryPressureLimit= 50%: a fraction of 2^32


# -- oomd.conf ----------------------------------------------------------------------


def test_defaults_are_systemd_s() -> None:
    assert parse_oomd_conf([]) == OomdConfig(90.0, 60.0, 30.0)


def test_later_files_win_and_an_empty_value_resets() -> None:
    config = parse_oomd_conf(
        [
            ("oomd.conf", "[OOM]\nSwapUsedLimit=80%\nDefaultMemoryPressureLimit=70%\n"),
            ("10-ubuntu.conf", "# Ubuntu\n[OOM]\nDefaultMemoryPressureDurationSec=20s\n"),
            ("20-reset.conf", "[OOM]\nSwapUsedLimit=\n"),
            ("30-other.conf", "[Other]\nDefaultMemoryPressureLimit=5%\n"),
        ]
    )
    assert config == OomdConfig(90.0, 70.0, 20.0)


def test_a_zero_duration_is_the_default_and_one_under_a_second_ignored() -> None:
    config = parse_oomd_conf(
        [
            ("a.conf", "[OOM]\nDefaultMemoryPressureDurationSec=20s\n"),
            ("b.conf", "[OOM]\nDefaultMemoryPressureDurationSec=500ms\n"),
        ]
    )
    assert config.pressure_duration == 20.0
    assert len(config.problems) == 1
    zero = parse_oomd_conf([("a.conf", "[OOM]\nDefaultMemoryPressureDurationSec=0\n")])
    assert zero.pressure_duration == 30.0


def test_bad_values_are_reported_and_ignored() -> None:
    config = parse_oomd_conf(
        [("x.conf", "[OOM]\nSwapUsedLimit=lots\nDefaultMemoryPressureDurationSec=soon\n")]
    )
    assert (config.swap_used_limit, config.pressure_duration) == (90.0, 30.0)
    assert len(config.problems) == 2
    assert "SwapUsedLimit='lots' not understood" in config.problems[0]


@pytest.mark.parametrize(
    ("text", "value"),
    [("90%", 90.0), ("62.5%", 62.5), ("900‰", 90.0), ("9000‱", 90.0), ("101%", None), ("x", None)],
)
def test_percentages(text: str, value: float | None) -> None:
    assert _percent(text) == value


@pytest.mark.parametrize(
    ("text", "value"),
    [("20s", 20.0), ("20", 20.0), ("1min 30s", 90.0), ("500ms", 0.5), ("2h", 7200.0)],
)
def test_timespans(text: str, value: float) -> None:
    assert _timespan(text) == value


@pytest.mark.parametrize("text", ["", "soon", "20 parsecs", "1" * 80])
def test_not_timespans(text: str) -> None:
    assert _timespan(text) is None


def test_config_files_are_read_as_oomd_reads_them(tmp_path: Path) -> None:
    def put(rel: str, text: str) -> None:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)

    put("usr/lib/systemd/oomd.conf", "[OOM]\nSwapUsedLimit=80%\n")
    # Ubuntu's drop-in, and one of the same name in /etc that hides it.
    put("usr/lib/systemd/oomd.conf.d/10-oomd.conf", "[OOM]\nDefaultMemoryPressureDurationSec=20s\n")
    put("etc/systemd/oomd.conf.d/10-oomd.conf", "[OOM]\nDefaultMemoryPressureLimit=55%\n")
    put("run/systemd/oomd.conf.d/05-first.conf", "[OOM]\nDefaultMemoryPressureLimit=40%\n")
    put("etc/systemd/oomd.conf.d/ignored.txt", "[OOM]\nSwapUsedLimit=1%\n")
    assert read_oomd_config(tmp_path) == OomdConfig(80.0, 55.0, 30.0)
    assert read_oomd_config(tmp_path / "nothing") == OOMD_DEFAULTS


# -- the rules over the agents --------------------------------------------------------


def test_unit_properties_as_rules() -> None:
    rules = parse_unit_rules(
        "user@1000.service",
        "system",
        {
            "ManagedOOMMemoryPressure": "kill",
            "ManagedOOMMemoryPressureLimit": HALF,
            "ManagedOOMMemoryPressureDurationUSec": 20_000_000,
            "ManagedOOMSwap": "auto",
            "ManagedOOMPreference": "none",
            "ControlGroup": "/user.slice/user-1000.slice/user@1000.service",
        },
    )
    assert (rules.pressure, rules.pressure_limit, rules.pressure_duration) == ("kill", 50.0, 20.0)
    assert rules.cgroup == "/user.slice/user-1000.slice/user@1000.service"


def test_unset_and_wrong_values_count_as_unset() -> None:
    rules = parse_unit_rules(
        "-.slice",
        "system",
        {
            "ManagedOOMSwap": "explode",
            "ManagedOOMMemoryPressure": 1,
            "ManagedOOMMemoryPressureLimit": 0,
            "ManagedOOMMemoryPressureDurationUSec": (1 << 64) - 1,
            "ManagedOOMPreference": ["avoid"],
            "ControlGroup": "",
        },
    )
    assert rules == UnitRules("-.slice", "system")
    # systemd 247 spelled the limit as a percentage string.
    old = parse_unit_rules("x.slice", "system", {"ManagedOOMMemoryPressureLimitPercent": "60%"})
    assert old.pressure_limit == 60.0


def test_ancestors_of_the_agents_slice() -> None:
    assert [u for u, _ in agents_ancestors(SLICE, "user", 1000)] == [
        SLICE,
        "app-agentscope.slice",
        "app.slice",
        "user@1000.service",
        "user-1000.slice",
        "user.slice",
        "-.slice",
    ]
    assert {m for _, m in agents_ancestors(SLICE, "user", 1000)[:3]} == {"user"}
    assert agents_ancestors(SLICE, "system", 0)[-1] == ("-.slice", "system")


def _fake(tmp_path: Path, manager: str, units: dict[str, dict[str, Any]]) -> FakeSystemd:
    """A manager that knows ``units`` with these properties (the agents slice included)."""
    bus = FakeSystemd(tmp_path / manager, manager=manager)
    for name, props in units.items():
        if name == SLICE:
            bus.slice_props.update(props)
        else:
            bus.units[name] = FakeUnit(name, props, tmp_path / manager)
    return bus


#: The agents slice with agentscope's drop-in in effect.
OURS = {
    "ManagedOOMMemoryPressure": "kill",
    "ManagedOOMMemoryPressureLimit": int(0.8 * (1 << 32)),
    "ManagedOOMSwap": "auto",
    "ManagedOOMPreference": "avoid",
}


async def test_ubuntu_s_rules_under_the_user_manager(tmp_path: Path) -> None:
    """user@.service at 50 % (20 s from oomd.conf.d) and -.slice's swap rule."""
    user = _fake(tmp_path, "user", {SLICE: OURS, "app-agentscope.slice": {}, "app.slice": {}})
    system = _fake(
        tmp_path,
        "system",
        {
            "user@1000.service": {
                "ManagedOOMMemoryPressure": "kill",
                "ManagedOOMMemoryPressureLimit": HALF,
            },
            "user-1000.slice": {},
            "user.slice": {},
            "-.slice": {"ManagedOOMSwap": "kill"},
        },
    )
    chain = await read_oomd_chain(
        {"user": user, "system": system}, agents_ancestors(SLICE, "user", 1000)
    )
    assert [u.error for u in chain] == [None] * 7
    view = assess_oomd("active", OomdConfig(90.0, 60.0, 20.0), chain)
    got = [(r.unit, r.kind, r.limit, r.duration, r.honours_avoid, r.own) for r in view.rules]
    assert got == [
        (SLICE, "pressure", 80.0, 20.0, True, True),
        ("user@1000.service", "pressure", 50.0, 20.0, True, False),
        ("-.slice", "swap", 90.0, None, False, False),
    ]
    assert [r.unit for r in view.foreign_rules] == ["user@1000.service", "-.slice"]
    summary = view.summary()
    assert summary.startswith("systemd-oomd is active; the agents slice's own rule")
    assert "swap rule on -.slice (system manager): memory and swap over 90% used" in summary
    assert "ignores the scopes' ManagedOOMPreference= (their owner is not the rule's)" in summary
    # Its victim: a tool call where the scope is delegated (docs/calls.md), else the agent.
    assert "would kill a tool call, or a whole agent" in summary
    assert "kills the tool call or agent reclaiming most" in summary
    assert view.to_dict()["rules"][1]["unit"] == "user@1000.service"


def test_fedora_s_per_slice_rules_and_the_system_manager() -> None:
    fedora = {"pressure": "kill", "pressure_limit": 80.0}
    chain = [
        UnitRules(SLICE, "system", **fedora),  # type: ignore[arg-type]
        UnitRules("app-agentscope.slice", "system"),
        UnitRules("app.slice", "system", **fedora),  # type: ignore[arg-type]
        UnitRules("-.slice", "system", swap="kill"),
    ]
    view = assess_oomd("active", OOMD_DEFAULTS, chain)
    assert [(r.unit, r.kind, r.duration) for r in view.rules] == [
        (SLICE, "pressure", 30.0),
        ("app.slice", "pressure", 30.0),
        ("-.slice", "swap", None),
    ]
    # Root's scopes: oomd honours their preference under every rule.
    assert all(r.honours_avoid for r in view.rules)


def test_a_unit_that_cannot_be_read_is_kept_with_its_error() -> None:
    view = assess_oomd("active", OOMD_DEFAULTS, [UnitRules(SLICE, "user", error="no bus")])
    assert view.rules == ()
    assert "no rule of it covers" not in view.summary()
    assert "no rule covers the agents slice" in view.summary()


async def test_a_missing_bus_is_an_error_not_a_rule(tmp_path: Path) -> None:
    user = _fake(tmp_path, "user", {SLICE: OURS})
    chain = await read_oomd_chain({"user": user}, [(SLICE, "user"), ("nosuch.slice", "user")])
    assert chain[0].preference == "avoid"
    assert chain[1].error is not None
    assert "not loaded" in chain[1].error
    assert chain[1].pressure == "auto"


def test_oomd_that_does_not_run_kills_nothing() -> None:
    chain = [UnitRules(SLICE, "system", pressure="kill")]
    for state in (None, "inactive", "not-found"):
        view = assess_oomd(state, OOMD_DEFAULTS, chain)
        assert not view.running
        assert "it kills nothing" in view.summary()
    assert assess_oomd("listening", OOMD_DEFAULTS, chain).running


async def test_oomd_state_from_the_bus_else_its_socket(tmp_path: Path) -> None:
    system = _fake(tmp_path, "system", {"systemd-oomd.service": {"LoadState": "loaded"}})
    assert await oomd_state(system) == "active"
    system.units["systemd-oomd.service"].props["LoadState"] = "not-found"
    assert await oomd_state(system) == "not-found"
    assert await oomd_state(None, socket_present=True) == "listening"
    assert await oomd_state(None) is None


# -- oomd's kills ---------------------------------------------------------------------

SWAP_LINE = (
    f"Killed {USER_SLICE}/{UNIT} due to memory used (771231744) / total (804220928) and "
    "swap used (728760320) / total (805302272) being more than 90.00%"
)
PRESSURE_LINE = (
    f"Killed {USER_SLICE}/{UNIT} due to memory pressure for "
    "/user.slice/user-1000.slice/user@1000.service being 61.23% > 50.00% for > 20s "
    "with reclaim activity"
)


def test_oomd_s_swap_line() -> None:
    line = parse_oomd_line(SWAP_LINE)
    assert line is not None
    assert (line.cgroup, line.rule, line.limit) == (f"{USER_SLICE}/{UNIT}", "swap", 90.0)


def test_oomd_s_pressure_line() -> None:
    line = parse_oomd_line(PRESSURE_LINE)
    assert line is not None
    assert line.rule == "pressure"
    assert line.monitored == "/user.slice/user-1000.slice/user@1000.service"
    assert (line.pressure, line.limit, line.duration) == (61.23, 50.0, "20s")


def test_newer_oomd_marks_before_it_kills() -> None:
    text = PRESSURE_LINE.replace(f"{UNIT} due to", f"{UNIT} for killing due to").replace(
        "Killed", "Marked", 1
    )
    line = parse_oomd_line(text)
    assert line is not None
    assert line.cgroup.endswith(UNIT)


@pytest.mark.parametrize(
    "text",
    [
        "Killed process 4242 (node) total-vm:1kB, anon-rss:1kB",  # the kernel's
        "Killed /a b.scope due to memory used (1) / total (2) and swap used (1) / total (2) "
        "being more than 90.00%",
        f"Killed {USER_SLICE}/{UNIT} due to boredom",
        "systemd-oomd killed 3 process(es) in this unit.",
        SWAP_LINE + " " + "x" * MAX_LINE,
        "",
    ],
)
def test_other_lines_are_not_oomd_kills(text: str) -> None:
    assert parse_oomd_line(text) is None


def test_a_kill_names_the_agent_by_the_scope_below_the_slice() -> None:
    line = parse_oomd_line(SWAP_LINE.replace(UNIT, f"{UNIT}/tool-1"))
    assert line is not None
    event = oomd_kill_event(line, USER_SLICE, {UNIT: "coder"}.get, 5.0)
    assert event is not None
    assert (event.agent, event.unit, event.cgroup) == ("coder", UNIT, f"{USER_SLICE}/{UNIT}/tool-1")
    assert oomd_kill_event(line, USER_SLICE, lambda u: None, 5.0).agent is None  # type: ignore[union-attr]
    # A kill outside the slice, or of no scope, is none of the fleet's.
    other = parse_oomd_line(SWAP_LINE.replace(f"{USER_SLICE}/{UNIT}", "/user.slice/x.scope"))
    assert other is not None
    assert oomd_kill_event(other, USER_SLICE, str, 5.0) is None
    assert event.call is None  # a sub-cgroup that is no call


def test_a_kill_of_a_call_names_the_call_and_validates() -> None:
    # Delegated scopes (docs/calls.md): oomd's leaf is the tool call, not the agent.
    line = parse_oomd_line(SWAP_LINE.replace(UNIT, f"{UNIT}/call-make-2"))
    assert line is not None
    event = oomd_kill_event(line, USER_SLICE, {UNIT: "coder"}.get, 5.0)
    assert event is not None
    assert (event.agent, event.unit, event.call) == ("coder", UNIT, "call-make-2")
    assert validate(monitor_event_dict("default", event)) == "agentscope.event/1"
    leaf = parse_oomd_line(SWAP_LINE.replace(UNIT, f"{UNIT}/agent"))
    assert leaf is not None
    assert oomd_kill_event(leaf, USER_SLICE, str, 5.0).call is None  # type: ignore[union-attr]


def test_the_event_has_its_schema() -> None:
    line = parse_oomd_line(PRESSURE_LINE)
    assert line is not None
    event = oomd_kill_event(line, USER_SLICE, {UNIT: "coder"}.get, 5.0)
    assert isinstance(event, OomdKill)
    data = monitor_event_dict("default", event)
    assert (data["kind"], data["agent"]) == ("oomd_kill", "coder")
    assert validate(data) == "agentscope.event/1"


def oomd_monitor(tmp_path: Path, seen: list[Any]) -> Monitor:
    """A monitor of the user's agents slice (``coder`` in UNIT); its events go to ``seen``."""
    root = tmp_path / "cgroup"
    slice_path = root / USER_SLICE.lstrip("/")
    slice_path.mkdir(parents=True)
    return Monitor(
        slice_path=slice_path,
        unit_agent={UNIT: "coder"}.get,
        cgroup_root=root,
        kmsg=None,
        on_event=seen.append,
    )


def test_the_monitor_turns_oomd_s_journal_line_into_an_event(tmp_path: Path) -> None:
    seen: list[Any] = []
    mon = oomd_monitor(tmp_path, seen)
    assert mon._logs.oomd_line(SWAP_LINE)
    assert not mon._logs.oomd_line("Killed process 7 (node) total-vm:1kB")
    other = SWAP_LINE.replace(f"{USER_SLICE}/{UNIT}", "/system.slice/cron.service")
    assert mon._logs.oomd_line(other)  # oomd's line, but no agent of this fleet: no event
    assert [(type(e), e.agent, e.rule) for e in seen] == [(OomdKill, "coder", "swap")]


def test_oomd_naming_its_victim_again_is_one_kill(tmp_path: Path) -> None:
    # Measured (trixie, TCG): oomd's swap rule named the same call twice, 1.2 s
    # apart, while the killed runaway still held 380 MiB of swap.
    seen: list[Any] = []
    mon = oomd_monitor(tmp_path, seen)
    call = SWAP_LINE.replace(UNIT, f"{UNIT}/call-grow-1")
    assert mon._logs.oomd_line(call)
    assert mon._logs.oomd_line(call)  # oomd's line still, but no second event
    assert mon._logs.oomd_line(SWAP_LINE.replace(UNIT, f"{UNIT}/call-grow-2"))
    assert [e.call for e in seen] == ["call-grow-1", "call-grow-2"]


def test_a_repeat_is_one_kill_within_its_window_only() -> None:
    repeats = OomdRepeats(window=10.0)
    assert repeats.first("/a/call-x-1", 100.0)
    assert not repeats.first("/a/call-x-1", 101.2)
    assert not repeats.first("/a/call-x-1", 110.0)  # the window slides with each repeat
    assert repeats.first("/a/call-x-2", 110.5)
    assert repeats.first("/a/call-x-1", 125.0)  # a new kill of a new call of that name


@pytest.mark.parametrize("kmsg", [False, True])
async def test_a_monitor_follows_oomd_s_journal_where_oomd_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kmsg: bool
) -> None:
    """The follower also reads oomd's lines; with /dev/kmsg open, oomd's lines only.

    An oomd line is believed only from oomd's unit, as journald names it (#31).
    """
    cg = make_cgroup_root(tmp_path / "cg")
    slice_path = make_cgroup(cg, USER_SLICE.lstrip("/"))
    proc = tmp_path / "proc"
    make_meminfo(proc)
    make_host_pressure(proc, format_pressure((0, 0, 0, 0), (0, 0, 0, 0)))
    socket = tmp_path / "io.systemd.ManagedOOM"
    socket.touch()
    monkeypatch.setattr(_logwatch, "OOMD_SOCKET", socket)
    asked: list[dict[str, bool]] = []
    head = {"__CURSOR": "s=1;i=2", "_BOOT_ID": "0" * 32, "_TRANSPORT": "journal"}
    # Another unit's line in oomd's words (a pressure kill): not oomd's.
    forged = json.dumps({**head, "_SYSTEMD_UNIT": "evil.service", "MESSAGE": PRESSURE_LINE})
    unitless = json.dumps({**head, "MESSAGE": PRESSURE_LINE})
    entry = json.dumps({**head, "_SYSTEMD_UNIT": "systemd-oomd.service", "MESSAGE": SWAP_LINE})
    # The kernel's summary of a kill, and a user's copy of one: only the first is believed.
    task = (
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        f"oom_memcg={USER_SLICE}/{UNIT},task_memcg={USER_SLICE}/{UNIT},task=node,pid={{}},uid=1000"
    )
    kernel = json.dumps({**head, "_TRANSPORT": "kernel", "MESSAGE": task.format(4243)})
    user = json.dumps({**head, "_SYSTEMD_UNIT": "evil.service", "MESSAGE": task.format(4242)})

    def follower(**kw: bool) -> subprocess.Popen[bytes]:
        asked.append(kw)
        script = 'printf "%s\\n" "$0" "$1" "$2" "$3" "$4"; exec sleep 60'
        argv = ["sh", "-c", script, forged, unitless, kernel, user, entry]
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert child.stdout is not None
        os.set_blocking(child.stdout.fileno(), False)
        return child

    monkeypatch.setattr(_logwatch, "start_follower", follower)
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    holder = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a writer: the reader never sees EOF
    seen: list[Any] = []
    arrived = asyncio.Event()

    def on_event(event: Any) -> None:
        seen.append(event)
        arrived.set()

    mon = Monitor(
        slice_path=slice_path,
        unit_agent={UNIT: "coder"}.get,
        interval=0.05,
        cgroup_root=cg,
        proc_root=proc,
        kmsg=fifo if kmsg else None,
        journal=True,
        on_event=on_event,
    )
    try:
        async with mon:
            async with asyncio.timeout(10):
                await arrived.wait()
            # The kernel's lines come from the journal only where /dev/kmsg is closed.
            assert mon._counter.await_kernel is not kmsg
            assert set(mon._counter._kernel_memcg) == {4243}
    finally:
        os.close(holder)
    assert asked == [{"kernel": not kmsg, "oomd": True}]
    assert [(type(e), e.agent, e.unit, e.rule) for e in seen] == [(OomdKill, "coder", UNIT, "swap")]


def test_the_journal_follower_reads_oomd_s_own_messages() -> None:
    argv = follow_argv("/usr/bin/journalctl", oomd=True)
    assert argv[-3:] == ["_TRANSPORT=kernel", "+", "_SYSTEMD_UNIT=systemd-oomd.service"]
    assert follow_argv("/usr/bin/journalctl", kernel=False, oomd=True)[-1] == (
        "_SYSTEMD_UNIT=systemd-oomd.service"
    )
    assert follow_argv("/usr/bin/journalctl")[-1] == "_TRANSPORT=kernel"
    with pytest.raises(ValueError, match="a follower of nothing"):
        follow_argv("/usr/bin/journalctl", kernel=False)


# -- doctor ---------------------------------------------------------------------------


def _check(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(manager="user", user="dev", oomd_binary=True)
    (check,) = [
        c for c in _doctor.checks(_doctor.Facts(**(base | over))) if c["name"] == "systemd_oomd"
    ]
    return check


def test_doctor_never_asks_for_oomd() -> None:
    for facts in ({"oomd_binary": False}, {"oomd_state": "inactive"}, {"oomd_state": "masked"}):
        check = _check(**facts)
        assert check["status"] == "pass"
        assert "it kills no agent" in check["detail"]
        assert check["fix"] is None


def test_doctor_shows_oomd_s_rules_and_installs_the_drop_ins() -> None:
    rule = "pressure rule on user@1000.service (system manager): ..."
    missing = _check(oomd_state="active", oomd_running=True, oomd_rules=(rule,), oomd_dropins=False)
    assert missing["status"] == "warn"
    assert rule in missing["detail"]
    assert "not in effect" in missing["detail"]
    assert missing["fix"].startswith("agentscope install --user")
    system = _check(
        manager="system",
        oomd_state="active",
        oomd_running=True,
        oomd_rules=(rule,),
        oomd_dropins=False,
    )
    assert system["fix"].startswith("sudo agentscope install --system")
    swap = "swap rule on -.slice (system manager): ... ignores the scopes' preference"
    unprotected = _check(
        oomd_state="active",
        oomd_running=True,
        oomd_rules=(rule, swap),
        oomd_unprotected=(swap,),
        oomd_dropins=True,
    )
    assert unprotected["status"] == "warn"
    assert swap in unprotected["detail"]
    assert "system manager" in unprotected["fix"]
    fine = _check(oomd_state="active", oomd_running=True, oomd_rules=(rule,), oomd_dropins=True)
    assert fine["status"] == "pass"
    assert rule in fine["detail"]
    none = _check(oomd_state="active", oomd_running=True)
    assert none["status"] == "pass"
    assert "no rule" in none["detail"]
    error = _check(oomd_error="the system manager is unreachable: no bus")
    assert error["status"] == "warn"
    assert error["fix"]
