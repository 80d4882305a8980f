"""The demo's pure parts: the fleet it launches, the outcomes it checks, what it prints.

The demo itself (launches, a real OOM kill) runs in the VMs:
integration/tests/test_demo.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from cli import _demo, _render
from cli._app import run_app
from cli._errors import BadInput
from cli._fleet import Options

AGENTS = ["planner", "coder-1", "coder-2", "coder-3", "reviewer", "tester", "docs", "indexer"]


def _summary(**over: Any) -> dict[str, Any]:
    """What a demo that went right reports (the fields checks_of reads)."""
    summary: dict[str, Any] = {
        "agents": AGENTS,
        "runaway": "coder-2",
        "oom_kills": [{"agent": "coder-2", "pid": 812, "comm": "python3"}],
        "agents_after": [{"name": n, "state": "running"} for n in AGENTS],
        "alive_after": list(AGENTS),
        "manager_alive": True,
        "slice_limits": {"MemoryHigh": None, "MemoryMax": None, "MemorySwapMax": None},
        "largest_per_agent": {n: {"pid": 1, "comm": "sh", "rss": 1 << 20} for n in AGENTS},
    }
    summary["oom_kill"] = summary["oom_kills"][0]
    return summary | over


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
            {"oom_kills": [], "oom_kill": None},
            "oom_kill_seen runaway_named process_named only_the_runaway_killed",
        ),
        ({"oom_kill": {"agent": None, "pid": 1, "comm": "python3"}}, "runaway_named"),
        ({"oom_kill": {"agent": "coder-2", "pid": None, "comm": None}}, "process_named"),
        (
            {"oom_kills": [{"agent": "coder-2"}, {"agent": "planner"}]},
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
