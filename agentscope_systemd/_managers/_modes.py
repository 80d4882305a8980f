"""Which manager runs a fleet's scopes here: systemd, a delegated cgroup, or process trees.

A fleet's ``manager`` (``--manager`` on the command line) is a *mode*
(issue #27): ``systemd`` (``system`` or ``user`` name which systemd
manager), ``cgroup`` (a writable, delegated cgroup v2 subtree the fleet
manages itself) or ``process`` (process trees tracked by pidfd, for a
read-only cgroupfs: the Docker and Kubernetes default). ``auto``, the
default, takes the first that works here, in that order:

- systemd, where PID 1 is systemd (the cgroup tree is then systemd's: a
  bus that does not answer fails the open with SystemdUnavailable, it does
  not pick another mode; a connect to the bus socket tells the reason);
- cgroup, where this process's own cgroup v2 is writable (its
  ``cgroup.procs`` and ``cgroup.subtree_control``: what moving itself into
  a leaf and enabling controllers needs);
- process, anywhere else.

:func:`choose_mode` decides without side effects and says why
(:class:`ModeChoice`); a mode asked for by name that cannot work here is
refused by :func:`check_forced` with what would enable it, before anything
is created.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import _names
from .._errors import InvalidConfig, ModeUnavailable
from .._kernel._cgroup import CGROUP_ROOT
from .._kernel._container import ContainerView, inspect_container
from . import _wire

if TYPE_CHECKING:
    from ._bus import Manager

__all__ = ["MODES", "ModeChoice", "check_forced", "choose_mode", "parse_manager"]

#: The modes, in the order ``auto`` tries them.
MODES = ("systemd", "cgroup", "process")

#: What ``manager`` accepts: a mode, ``auto``, or which systemd manager.
CHOICES = ("auto", "systemd", "system", "user", "cgroup", "process")


@dataclass(frozen=True, slots=True)
class ModeChoice:
    """The mode a fleet runs in and why (one sentence, for ``probe``, ``doctor``, ``ls``).

    ``flavour`` is whose state and runtime directories the fleet uses
    (``system`` for root, else ``user``; which systemd manager in systemd mode).
    """

    mode: str
    flavour: Manager
    reason: str
    forced: bool = False


def parse_manager(manager: str) -> tuple[str, Manager]:
    """``(mode or "auto", flavour)`` of a ``manager`` argument.

    Raises:
        InvalidConfig: not one of :data:`CHOICES`.
    """
    if not isinstance(manager, str) or manager not in CHOICES:
        raise InvalidConfig("manager", manager, ", ".join(CHOICES), problem="is not allowed")
    if manager in ("system", "user"):
        return "systemd", manager  # type: ignore[return-value]
    flavour = _names.resolve_manager("auto")
    return manager, flavour  # type: ignore[return-value]


def _bus_answers(flavour: str, env: Mapping[str, str]) -> str | None:
    """None if a bus socket of ``flavour`` takes a connection, else why not."""
    tried = []
    for address, _direct in _wire.addresses(flavour, env):
        try:
            path = _wire._socket_path(address)
        except _wire.Unsupported:
            return None  # not a socket we can try without the bus client: let it try
        tried.append(address)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(1.0)
        try:
            sock.connect(path)
            return None
        except OSError:
            continue
        finally:
            sock.close()
    return f"no {flavour} bus answers at {', '.join(tried)}"


def _delegated(view: ContainerView, cgroup_root: Path) -> str | None:
    """None if this process's own cgroup v2 can be managed here, else why not."""
    if not view.cgroup_v2:
        return f"{cgroup_root} is not a cgroup v2 mount"
    if view.own_cgroup is None:
        return "this process's cgroup v2 path is unknown (/proc/self/cgroup)"
    own = os.fspath(cgroup_root).rstrip("/") + "/" + view.own_cgroup.strip("/")
    own = own.rstrip("/")
    for name in ("cgroup.procs", "cgroup.subtree_control"):
        if not os.access(f"{own}/{name}", os.W_OK):
            return f"its own cgroup {view.own_cgroup} is read-only ({name})"
    return None


def choose_mode(
    manager: str = "auto",
    *,
    proc_root: Path | None = None,
    cgroup_root: Path = CGROUP_ROOT,
    env: Mapping[str, str] | None = None,
) -> ModeChoice:
    """The mode ``manager`` gives here, and why (no side effects).

    A forced mode is returned as asked (:func:`check_forced` says whether it
    can work); ``auto`` takes the first of :data:`MODES` that works.

    Raises:
        InvalidConfig: ``manager`` is not one of :data:`CHOICES`.
    """
    mode, flavour = parse_manager(manager)
    env = os.environ if env is None else env
    if mode != "auto":
        return ModeChoice(mode, flavour, f"--manager {manager} was asked for", forced=True)
    view = inspect_container(proc_root, cgroup_root, env=env)
    if view.systemd_pid1:
        # systemd owns a systemd host's cgroup tree: a cgroup not delegated to
        # us is its to write (https://systemd.io/CGROUP_DELEGATION/), and
        # process trees would quietly drop the scopes' isolation. A bus that
        # does not answer is a fault to report (the open raises
        # SystemdUnavailable, exit 4), not a reason to pick another mode.
        why_not = _bus_answers(flavour, env)
        if why_not is None:
            return ModeChoice("systemd", flavour, "PID 1 is systemd and its bus answers")
        return ModeChoice("systemd", flavour, f"PID 1 is systemd, but {why_not}")
    not_systemd = f"PID 1 is {view.pid1!r}, not systemd: {view.describe()}"
    why_not = _delegated(view, cgroup_root)
    if why_not is None:
        return ModeChoice(
            "cgroup", flavour, f"{not_systemd}; its own cgroup {view.own_cgroup} is writable"
        )
    return ModeChoice("process", flavour, f"{not_systemd}; {why_not}")


def check_forced(
    choice: ModeChoice,
    *,
    proc_root: Path | None = None,
    cgroup_root: Path = CGROUP_ROOT,
    env: Mapping[str, str] | None = None,
) -> None:
    """Refuse a forced ``cgroup`` mode where this process's cgroup cannot be managed.

    systemd forced is tried as it always was (its connect fails with
    :class:`SystemdUnavailable`, which says where PID 1 is not systemd);
    process mode works anywhere.

    Raises:
        ModeUnavailable: naming the mode, why, and what would enable it.
    """
    if not choice.forced or choice.mode != "cgroup":
        return
    view = inspect_container(proc_root, cgroup_root, env=os.environ if env is None else env)
    why_not = _delegated(view, cgroup_root)
    if why_not is not None:
        raise ModeUnavailable(
            "cgroup",
            why_not,
            "run with a writable, delegated cgroup v2 (docker --security-opt "
            "writable-cgroups=true, podman --systemd=always, or a service with Delegate=yes), "
            "or use --manager process",
        )
