"""The demo's pure parts: the fleet it launches, the outcomes it checks, what it prints.

The demo itself (launches, a real OOM kill) runs in the VMs:
integration/tests/test_demo.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentscope_systemd._cli import _demo, _render
from agentscope_systemd._cli._app import run_app
from agentscope_systemd._cli._errors import BadInput
from agentscope_systemd._cli._fleet import Options

AGENTS = ["planner", "coder-1", "coder-2", "coder-3", "reviewer", "tester", "docs", "indexer"]


def _summary(**over: Any) -> dict[str, Any]:
    """What a demo that went right reports (the fields checks_of reads)."""
    summary: dict[str, Any] = {
        "agents": AGENTS,
        "runaway": "coder-2",
        "kills": [{"kind": "oom_kill", "agent": "coder-2", "pid": 812, "comm": "python3"}],
        "agents_after": [{"name": n, "state": "running"} for n in AGENTS],
        "alive_after": list(AGENTS),
        "manager_alive": True,
        "slice_limits": {"MemoryHigh": None, "MemoryMax": None, "MemorySwapMax": None},
        "largest_per_agent": {n: {"pid": 1, "comm": "sh", "rss": 1 << 20} for n in AGENTS},
    }
    summary["kill"] = summary["kills"][0]
    return summary | over


def _guard_summary(**over: Any) -> dict[str, Any]:
    """What an uncapped demo (--global-oom) that went right reports: the guard's catch."""
    kill = {"kind": "guard_kill", "agent": "coder-2", "pid": 812, "comm": "python3"}
    return (
        _summary(global_oom=True, kills=[kill], kill=kill, oom_kills=[], kernel_oom_kills=0) | over
    )


def test_fleet_of_eight_with_one_runaway() -> None:
    specs = _demo.fleet_specs(8)
    assert [s.name for s in specs] == AGENTS
    assert [s.name for s in specs if s.runaway] == ["coder-2"]
    assert len({s.hold_mb for s in specs}) == 8  # varied memory
    assert all(s.terminal is None for s in specs)  # no tmux agent until TMUX_AGENT is set


def test_fleet_sizes() -> None:
    assert [s.name for s in _demo.fleet_specs(10)][-2:] == ["agent-9", "agent-10"]
    assert [s.name for s in _demo.fleet_specs(2) if s.runaway] == ["coder-1"]
    with pytest.raises(BadInput, match="at least 2"):
        _demo.fleet_specs(1)


def test_all_outcomes_pass() -> None:
    checks = _demo.checks_of(_summary())
    assert checks
    assert all(checks.values()), checks


@pytest.mark.parametrize(
    ("over", "failed"),
    [
        (
            {"kills": [], "kill": None},
            "oom_kill_seen runaway_named process_named only_the_runaway_killed",
        ),
        (
            {"kill": {"kind": "oom_kill", "agent": None, "pid": 1, "comm": "python3"}},
            "runaway_named",
        ),
        (
            {"kill": {"kind": "oom_kill", "agent": "coder-2", "pid": None, "comm": None}},
            "process_named",
        ),
        (
            {"kills": [{"agent": "coder-2"}, {"agent": "planner"}]},
            "only_the_runaway_killed",
        ),
        ({"alive_after": [n for n in AGENTS if n != "tester"]}, "others_running"),
        (
            {
                "agents_after": [
                    {"name": n, "state": "exited" if n == "docs" else "running"} for n in AGENTS
                ]
            },
            "others_running",
        ),
        ({"manager_alive": False}, "manager_alive"),
        ({"slice_limits": {"MemoryHigh": 1 << 30, "MemoryMax": None}}, "slice_unlimited"),
        ({"slice_limits": {}}, "slice_unlimited"),
        (
            {"largest_per_agent": dict.fromkeys(AGENTS)},
            "report_names_every_agent",
        ),
    ],
)
def test_each_outcome_fails_on_its_own(over: dict[str, Any], failed: str) -> None:
    checks = _demo.checks_of(_summary(**over))
    assert [k for k, ok in checks.items() if not ok] == failed.split()


def test_uncapped_demo_is_the_guards_catch() -> None:
    assert all(_demo.checks_of(_guard_summary()).values())
    # A kernel OOM kill is not the story there, even of the runaway.
    kernel = {"kind": "oom_kill", "agent": "coder-2", "pid": 812, "comm": "python3"}
    checks = _demo.checks_of(_guard_summary(kills=[kernel], kill=kernel, oom_kills=[kernel]))
    assert [k for k, ok in checks.items() if not ok] == ["guard_kill_seen", "no_kernel_oom_kill"]
    # Nor one outside the slice (a kernel kill the monitor cannot name).
    checks = _demo.checks_of(_guard_summary(kernel_oom_kills=1))
    assert [k for k, ok in checks.items() if not ok] == ["no_kernel_oom_kill"]
    # The capped demo expects the kernel's kill in the runaway's scope, not the guard's.
    guard = _guard_summary()["kill"]
    checks = _demo.checks_of(_summary(kills=[guard], kill=guard))
    assert [k for k, ok in checks.items() if not ok] == ["oom_kill_seen"]


def test_runaway_may_lose_its_shell_without_failing() -> None:
    # Only the others must survive: the runaway's own scope is allowed to end.
    alive = [n for n in AGENTS if n != "coder-2"]
    assert all(_demo.checks_of(_summary(alive_after=alive)).values())


def test_largest_per_agent() -> None:
    processes = [
        {"pid": 1, "comm": "python3", "rss": 400, "agent": "a"},
        {"pid": 2, "comm": "sh", "rss": 40, "agent": "a"},
        {"pid": 3, "comm": "sh", "rss": 30, "agent": "b"},
        {"pid": 4, "comm": "agentscope", "rss": 900, "agent": None},
    ]
    assert _demo.largest_per_agent(processes, ["a", "b", "c"]) == {
        "a": {"pid": 1, "comm": "python3", "rss": 400},
        "b": {"pid": 3, "comm": "sh", "rss": 30},
        "c": None,
    }


def test_views_render() -> None:
    kill = {
        "agent": "coder-2",
        "pid": 812,
        "comm": "python3",
        "rss_last_seen": 400 << 20,
        "source": "cgroup",
    }
    line = _render.render_text(_demo.oom_line(kill, 12.34))
    assert "agent coder-2, process python3 (pid 812, 400.0 MiB last seen)" in line
    assert "12.3s after" in line
    guard = {
        "agent": "coder-2",
        "pid": 812,
        "comm": "python3",
        "rss": 300 << 20,
        "swap": 0,
        "trigger": "memory",
        "mem_available_percent": 9.84,
        "reaction_seconds": 0.123,
    }
    line = " ".join(_render.render_text(_demo.guard_line(guard, 5.0)).split())  # unwrapped
    assert "guard kill: agent coder-2, process python3 (pid 812, 300.0 MiB)" in line
    assert "at MemAvailable 9.8%, 123 ms after the crossing; 5.0s after" in line
    checks = _demo.checks_of(_summary(manager_alive=False))
    verdict = _render.render_text(_demo.verdict_view(checks))
    assert "FAILED the manager (this process) kept running" in verdict
    assert verdict.count("ok ") == len(checks) - 1
    table = _render.render_text(
        _demo.report_table(
            [{"agent": "a", "memory_current": 10 << 20, "memory_peak": 20 << 20, "oom_kills": 1}],
            {"a": {"pid": 5, "comm": "sh", "rss": 9 << 20}, "b": None},
        )
    )
    assert "sh (pid 5)" in table
    assert "10.0 MiB" in table


def test_demo_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_app(["demo", "--agents", "1"], Options()) == 2
    assert run_app(["demo", "--memory-max", "lots"], Options()) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_the_demos_tables_keep_unit_names_whole_on_80_columns() -> None:
    import io

    from rich.console import Console
    from rich.text import Text

    unit = "agentscope-demo-a-rather-long-agent-name-for-a-demo-3f9a2c7d.scope"
    story = _demo._Story(quiet=False)
    out = io.StringIO()
    story.console = Console(file=out, width=80, color_system=None, force_terminal=False)
    agent = {"name": "runaway", "unit": unit, "state": "running", "pid": 7, "started": 0}
    story.say(Text("a sentence " * 12), _render.ls_table([agent], now=0))
    lines = out.getvalue().splitlines()
    assert any(unit in line for line in lines), out.getvalue()
    assert max(len(line) for line in lines[:2]) <= 80  # a sentence still wraps at the edge
