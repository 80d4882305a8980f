"""The CLI over a real ``agentscope_systemd.Fleet`` on the fake systemd manager and cgroup tree.

One helper for the tests that run commands end to end without systemd
(tests/test_contract.py's ``real`` fixture) and for tests/node_face.py,
which serves the Node client's tests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentscope_systemd
from agentscope_systemd._cli import _fleet
from agentscope_systemd._registry._registry import Registry
from tests.fakesystemd import FakeSystemd, end_children

__all__ = ["fake_fleet"]


@contextlib.contextmanager
def fake_fleet(root: Path, patch: pytest.MonkeyPatch) -> Iterator[FakeSystemd]:
    """``open_fleet`` gives a real Fleet on one fake manager under ``root``; ``open_history``
    its registry file. Agents (real children) are ended on the way out."""
    bus = FakeSystemd(root / "cgroup")
    patch.setenv("XDG_STATE_HOME", str(root / "state"))
    opened: list[
        agentscope_systemd.Fleet
    ] = []  # kept, so their children are reaped here, not by gc

    def open_fleet(opts: _fleet.Options) -> Any:
        fleet = agentscope_systemd.Fleet(
            opts.fleet,
            registry=root / "registry.db",
            manager_oom_score_adj=None,
            tmux_dir=root / "tmux",
            _bus=bus,
        )
        opened.append(fleet)
        return fleet

    patch.setattr(_fleet, "open_fleet", open_fleet)
    # events and gc read the registry file alone: the same file.
    patch.setattr(
        _fleet,
        "open_history",
        lambda opts: _fleet._History(Registry(root / "registry.db"), opts.fleet),
    )
    try:
        yield bus
    finally:
        end_children()
