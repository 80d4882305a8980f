"""``agentscope doctor``: gather facts about this host (I/O), then judge them (pure).

:func:`gather` does the probing through the library's public API;
:func:`checks` turns the facts into pass/warn/fail lines, each that is not a
pass with the command that fixes it.
"""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._managers import _wire
from ._fleet import Options

__all__ = ["Facts", "checks", "gather"]

OOMD_BINARY = Path("/usr/lib/systemd/systemd-oomd")
_AGENTS_SLICE = "app-agentscope-agents.slice"
LINGER_DIR = Path("/var/lib/systemd/linger")


@dataclass(frozen=True)
class Facts:
    """What :func:`gather` found; ``None`` where it could not tell, with the reason beside."""

    manager: str
    user: str
    capabilities: dict[str, Any] | None = None
    unreachable: str | None = None
    default_oom_policy: str | None = None
    default_oom_policy_error: str | None = None
    oomd_binary: bool = False
    oomd_state: str | None = None
    linger: bool | None = None
    oom_score_adj: int | None = None
    #: Who names OOM victims: /dev/kmsg, else the system journal (and the groups it grants).
    kmsg_readable: bool = False
    journal_readable: bool = False
    journal_groups: tuple[str, ...] = ()
    #: The user is listed in one of ``journal_groups`` (this process may predate it).
    journal_member: bool = False
    #: What systemd-oomd would do to the fleet (agentscope_systemd.lowlevel.assess_oomd):
    #: whether it runs, the rules covering the agents slice (one line each), those
    #: under which oomd ignores the agent scopes' ManagedOOMPreference=avoid,
    #: and whether agentscope's drop-ins are in effect on the slice (None: unknown).
    oomd_running: bool = False
    oomd_rules: tuple[str, ...] = ()
    oomd_unprotected: tuple[str, ...] = ()
    oomd_dropins: bool | None = None
    oomd_error: str | None = None
    #: Where PID 1 is not systemd: the container this looks like, its cgroup
    #: and memory limit (agentscope_systemd.lowlevel.inspect_container; None: not looked).
    container: Any = None
    #: The manager mode the fleet gets here and why (agentscope_systemd.lowlevel.choose_mode).
    mode: str | None = None
    mode_reason: str | None = None
    #: The compiled launch gate's path; "" where this install has none (the gate
    #: runs in Python, in preexec_fn: _fleet/_spawn.py); None: not looked.
    launch_gate: str | None = None


async def _manager_facts(manager: str) -> tuple[str | None, str | None, str | None]:
    from agentscope_systemd import AgentscopeError
    from agentscope_systemd.lowlevel import SystemdBus

    policy = policy_error = oomd = None
    bus = SystemdBus(manager)
    try:
        policy = str(await bus.get_property(_wire.SD_PATH, _wire.SD_MANAGER, "DefaultOOMPolicy"))
    except AgentscopeError as exc:  # systemd < 243 has no DefaultOOMPolicy
        policy_error = str(exc)
    finally:
        bus.close()
    system = SystemdBus("system")  # systemd-oomd is a system service
    try:
        path = await system.unit_path("systemd-oomd.service")
        oomd = str(await system.get_property(path, _wire.SD_UNIT, "ActiveState"))
    except AgentscopeError:
        oomd = None
    finally:
        system.close()
    return policy, policy_error, oomd


async def _oomd_facts(manager: str, slice_name: str) -> dict[str, Any]:
    """What systemd-oomd would do to the fleet: its state, the rules over the agents slice."""
    from agentscope_systemd import AgentscopeError
    from agentscope_systemd.lowlevel import (
        OOMD_SOCKET,
        SystemdBus,
        agents_ancestors,
        assess_oomd,
        oomd_state,
        read_oomd_chain,
        read_oomd_config,
    )

    system = SystemdBus("system")
    own = SystemdBus(manager) if manager == "user" else None
    try:
        try:
            await system.connect()
        except AgentscopeError as exc:
            return {"oomd_error": f"the system manager is unreachable: {exc}"}
        state = await oomd_state(system, socket_present=await asyncio.to_thread(OOMD_SOCKET.exists))
        config = await asyncio.to_thread(read_oomd_config)
        chain = agents_ancestors(slice_name, manager, os.getuid())
        buses = {"system": system, **({"user": own} if own is not None else {})}
        view = assess_oomd(state, config, await read_oomd_chain(buses, chain))
    finally:
        system.close()
        if own is not None:
            own.close()
    agents = view.chain[0]
    return {
        "oomd_state": state,
        "oomd_running": view.running,
        "oomd_rules": tuple(r.describe() for r in view.rules),
        "oomd_unprotected": tuple(r.describe() for r in view.rules if not r.honours_avoid),
        "oomd_dropins": None if agents.error else agents.preference == "avoid",
    }


def gather(opts: Options) -> Facts:
    """Probe systemd, the cgroup tree and this process for :func:`checks`."""
    import agentscope_systemd
    from agentscope_systemd._fleet._spawn import gate_program
    from agentscope_systemd.lowlevel import (
        choose_mode,
        inspect_container,
        journal_access,
        kmsg_readable,
        read_oom_score_adj,
    )

    manager = opts.resolved_manager
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid with no passwd entry (a container, a deleted user)
        user = str(os.getuid())
    caps: dict[str, Any] | None = None
    unreachable = policy = policy_error = oomd = None
    try:
        caps = agentscope_systemd.probe_sync(manager).to_dict()
    except agentscope_systemd.SystemdUnavailable as exc:
        unreachable = str(exc)
    oomd_facts: dict[str, Any] = {}
    if caps is not None:
        policy, policy_error, oomd = asyncio.run(_manager_facts(manager))
        oomd_facts = asyncio.run(_oomd_facts(manager, str(caps.get("slice") or _AGENTS_SLICE)))
    journal = journal_access()
    choice = choose_mode(opts.manager)
    return Facts(
        manager=manager,
        user=user,
        capabilities=caps,
        unreachable=unreachable,
        default_oom_policy=policy,
        default_oom_policy_error=policy_error,
        oomd_binary=OOMD_BINARY.exists(),
        linger=(LINGER_DIR / user).exists() if manager == "user" else None,
        oom_score_adj=read_oom_score_adj(os.getpid()),
        kmsg_readable=kmsg_readable(),
        journal_readable=journal.readable,
        journal_groups=journal.groups,
        journal_member=_listed_in(user, journal.groups),
        container=inspect_container(),
        mode=choice.mode,
        mode_reason=choice.reason,
        launch_gate=gate_program() or "",
        **{"oomd_state": oomd, **oomd_facts},
    )


def _listed_in(user: str, groups: tuple[str, ...]) -> bool:
    """Whether ``user`` belongs to one of ``groups`` by the group database (a new login's view)."""
    try:
        entry = pwd.getpwnam(user)
        names = {grp.getgrgid(g).gr_name for g in os.getgrouplist(user, entry.pw_gid)}
    except (KeyError, OSError):
        return False
    return bool(names & set(groups))


def _victims_check(facts: Facts) -> dict[str, Any]:
    """Who names an OOM victim that no sample saw: the kernel's log, where readable."""
    if facts.kmsg_readable:
        return _check("oom_victims", "pass", "the kernel's log (/dev/kmsg) names OOM victims")
    if facts.journal_readable:
        return _check(
            "oom_victims",
            "pass",
            "the journal's kernel messages name OOM victims (/dev/kmsg is closed to this user)",
        )
    groups = facts.journal_groups or ("systemd-journal",)
    group = "systemd-journal" if "systemd-journal" in groups else groups[0]
    detail = (
        f"{facts.user} may read neither /dev/kmsg (kernel.dmesg_restrict=1) nor the system "
        "journal: a tool call OOM-killed before the monitor saw it is recorded without its "
        f"pid, name or RSS (groups that may read the journal: {', '.join(groups)})"
    )
    relogin = "log in again (a manager run as a user service: restart it after its user manager)"
    fix = (
        relogin
        if facts.journal_member
        else f"sudo usermod -aG {group} {facts.user}  # then {relogin}"
    )
    return _check("oom_victims", "warn", detail, fix)


def _oomd_check(facts: Facts) -> dict[str, Any]:
    """What systemd-oomd would do to the fleet, and agentscope's drop-ins as the fix.

    oomd kills a whole agent scope; its absence is no fault (the guard ends a
    squeeze), so this never suggests installing or starting it.
    """
    install = (
        "agentscope install --user"
        if facts.manager == "user"
        else "sudo agentscope install --system"
    )
    state = facts.oomd_state or ("installed" if facts.oomd_binary else "not installed")
    if facts.oomd_error is not None:
        return _check(
            "systemd_oomd",
            "warn",
            f"cannot tell what systemd-oomd does: {facts.oomd_error}",
            install,
        )
    if not facts.oomd_running:
        return _check(
            "systemd_oomd", "pass", f"systemd-oomd is {state}: it kills no agent (the guard acts)"
        )
    if not facts.oomd_rules:
        return _check(
            "systemd_oomd", "pass", f"systemd-oomd is {state}; no rule of it covers the agents"
        )
    rules = "; ".join(facts.oomd_rules)
    if facts.oomd_dropins is False:
        return _check(
            "systemd_oomd",
            "warn",
            f"systemd-oomd is {state} and may kill a whole agent: {rules}; agentscope's "
            "drop-ins (50-agentscope-oomd.conf: ManagedOOMPreference=avoid on every agent "
            "scope, the slice's rule after the guard's) are not in effect",
            f"{install}  # then restart the agents: a scope takes the drop-in when it starts",
        )
    if facts.oomd_unprotected:
        fix = (
            "run the fleet under the system manager, where oomd honours the scopes' "
            "ManagedOOMPreference=avoid: sudo agentscope install --system"
            if facts.manager == "user"
            else install
        )
        return _check(
            "systemd_oomd",
            "warn",
            f"systemd-oomd is {state}; under "
            + "; ".join(facts.oomd_unprotected)
            + ": the guard must act first (it acts at SwapFree <= 20%, the swap rule at 10%)",
            fix,
        )
    return _check(
        "systemd_oomd",
        "pass",
        f"systemd-oomd is {state}; {rules}; agentscope's drop-ins keep the guard first",
    )


def runs_without_systemd(facts: Facts) -> bool:
    """The fleet runs here in a mode that needs no systemd (doctor's exit is not 4 then)."""
    return facts.mode in ("cgroup", "process")


def _container_checks(facts: Facts, box: Any) -> list[dict[str, Any]]:
    """Where PID 1 is not systemd (a container): what it is, its cgroups, its memory limit."""
    systemd = f"PID 1 is not systemd: this looks like {box.describe()}; PID 1 is {box.pid1!r}"
    if runs_without_systemd(facts):
        # The fleet runs in another mode here (manager_mode says which): no failure.
        out = [
            _check("systemd", "warn", f"{systemd}; `agentscope exec` needs systemd"),
            _check(
                "container",
                "warn",
                f"{box.describe()}: the fleet runs in the {facts.mode} manager mode "
                "(docs/containers.md)",
            ),
        ]
    else:
        out = [
            _check(
                "systemd",
                "fail",
                systemd,
                "leave --manager at auto (the fleet runs in the process mode), "
                "agentscope exec --fallback run NAME -- CMD  # each agent unconfined; "
                "or start the container with systemd as PID 1 (podman run --systemd=always)",
            ),
            _check(
                "container",
                "warn",
                f"{box.describe()}: the systemd manager mode needs systemd",
            ),
        ]
    v2 = _cgroup_v2_check(box.cgroup_v2, "run the container on a host booted with")
    if facts.mode == "process" and v2["status"] == "fail":
        # The process mode runs agents without it; the guard cannot see the container's limit.
        v2["status"] = "warn"
        v2["detail"] += ": the guard cannot read the container's memory limit"
    out.append(v2)
    if box.own_cgroup is not None:
        if box.writable:
            out.append(
                _check(
                    "cgroup_writable",
                    "pass",
                    f"this process's cgroup {box.own_cgroup} is writable (a delegated subtree)",
                )
            )
        else:
            out.append(
                _check(
                    "cgroup_writable",
                    "warn",
                    f"this process's cgroup {box.own_cgroup} is read-only (the Docker and "
                    "Kubernetes default): agents cannot get cgroups of their own here",
                    "docker run --security-opt writable-cgroups=true, podman run "
                    "--systemd=always, or containerd 2.1's cgroup_writable (docs/containers.md)",
                )
            )
    if box.limit is not None:
        group = (
            "; memory.oom.group=1: one OOM kill there kills every process of it, manager and agents"
            if box.oom_group
            else ""
        )
        out.append(
            _check(
                "container_memory_limit",
                "warn" if box.oom_group else "pass",
                f"memory limit {box.limit >> 20} MiB on {box.limit_path}{group}; the guard "
                "acts on it before the kernel does (docs/guard.md)",
                "Kubernetes: singleProcessOOMKill: true in the kubelet's configuration (1.32+, "
                "node-wide)"
                if box.oom_group
                else None,
            )
        )
    elif box.cgroup_v2:
        out.append(_check("container_memory_limit", "pass", "no memory limit over this process"))
    for name in ("memory_controller", "scope_oom_policy", "slice_limits", "default_oom_policy"):
        out.append(_check(name, "pass", "not applicable: no systemd in this container"))
    return out


def _gate_check(program: str) -> dict[str, Any]:
    if program:
        return _check("launch_gate", "pass", f"launches pass the compiled gate {program}")
    return _check(
        "launch_gate",
        "warn",
        "this install has no compiled launch gate: each launch runs the gate as Python "
        "in the forked copy of this threaded process (preexec_fn), and cannot use vfork",
        "install a C compiler (Debian: gcc libc6-dev; Fedora: gcc glibc-static), then "
        "reinstall agentscope-systemd (docs/install.md, the launch gate)",
    )


def _cgroup_v2_check(unified: bool, fix: str) -> dict[str, Any]:
    if unified:
        return _check("cgroup_v2", "pass", "unified cgroup v2 hierarchy")
    return _check(
        "cgroup_v2",
        "fail",
        "no unified cgroup v2 hierarchy",
        f"{fix} systemd.unified_cgroup_hierarchy=1 on the kernel command line",
    )


def _check(name: str, status: str, detail: str, fix: str | None = None) -> dict[str, Any]:
    return {"name": name, "status": status, "detail": detail, "fix": fix}


def checks(facts: Facts, slice_name: str = "app-agentscope-agents.slice") -> list[dict[str, Any]]:
    """The doctor's verdicts, in a fixed order, from gathered facts."""
    user_flag = "--user " if facts.manager == "user" else ""
    sudo = "" if facts.manager == "user" else "sudo "
    out: list[dict[str, Any]] = []
    caps = facts.capabilities
    box = facts.container
    if caps is None and box is not None and not box.systemd_pid1:
        out.extend(_container_checks(facts, box))
    elif caps is None:
        out.append(
            _check(
                "systemd",
                "fail",
                facts.unreachable or "unreachable",
                f"sudo loginctl enable-linger {facts.user}"
                if facts.manager == "user"
                else "run on a host booted with systemd, with dbus running",
            )
        )
        for name in ("cgroup_v2", "memory_controller", "scope_oom_policy", "slice_limits"):
            out.append(_check(name, "warn", "not checked: systemd is unreachable"))
        out.append(_check("default_oom_policy", "warn", "not checked: systemd is unreachable"))
    else:
        out.append(
            _check(
                "systemd",
                "pass",
                f"{facts.manager} manager reachable at {caps['bus_address']}, "
                f"systemd {caps['systemd_version']}",
            )
        )
        out.append(_cgroup_v2_check(bool(caps["cgroup_v2"]), "boot with"))
        out.append(
            _check(
                "memory_controller",
                "pass",
                f"memory controller available to the {facts.manager} manager",
            )
            if caps["memory_controller"]
            else _check(
                "memory_controller",
                "fail",
                f"the memory controller is not available to the {facts.manager} manager",
                "sudo systemctl edit user@.service  # [Service] Delegate=pids memory cpu"
                if facts.manager == "user"
                else "enable the memory controller: boot with cgroup_enable=memory",
            )
        )
        out.append(
            _check("scope_oom_policy", "pass", "scopes accept OOMPolicy=continue")
            if caps["scope_oom_policy"]
            else _check(
                "scope_oom_policy",
                "warn",
                f"systemd {caps['systemd_version']} refuses OOMPolicy on scopes: an OOM kill "
                "may stop an agent's whole scope",
                "upgrade to systemd 253+ (Debian 12: 252.38+), or set DefaultOOMPolicy=continue",
            )
        )
        limits = caps.get("slice_limits") or {}
        stale = {k: v for k, v in limits.items() if v is not None}
        out.append(
            _check("slice_limits", "pass", f"{slice_name} has no memory limits")
            if not stale
            else _check(
                "slice_limits",
                "fail",
                f"{slice_name} carries "
                + ", ".join(f"{k}={v}" for k, v in stale.items())
                + " (a MemoryHigh there throttles every agent at once)",
                "agentscope doctor --fix  # or: "
                f"{sudo}systemctl {user_flag}set-property --runtime {slice_name} "
                + " ".join(f"{k}=infinity" for k in stale),
            )
        )
        policy = facts.default_oom_policy
        dropin = (
            "~/.config/systemd/user.conf.d/oom.conf"
            if facts.manager == "user"
            else "/etc/systemd/system.conf.d/oom.conf"
        )
        policy_fix = (
            f"printf '[Manager]\\nDefaultOOMPolicy=continue\\n' > {dropin}; "
            f"{sudo}systemctl {user_flag}daemon-reexec"
        )
        if policy is None:
            out.append(
                _check(
                    "default_oom_policy",
                    "warn",
                    f"cannot read DefaultOOMPolicy: {facts.default_oom_policy_error}",
                    policy_fix,
                )
            )
        elif policy == "continue" or caps["scope_oom_policy"]:
            out.append(_check("default_oom_policy", "pass", f"DefaultOOMPolicy={policy}"))
        else:
            out.append(
                _check(
                    "default_oom_policy",
                    "warn",
                    f"DefaultOOMPolicy={policy} and scopes take no OOMPolicy: an OOM kill "
                    "stops the agent's whole scope",
                    policy_fix,
                )
            )
    if box is not None and not box.systemd_pid1 and caps is None:
        # No systemd here, so no systemd-oomd either: nothing to install or set.
        out.append(_check("systemd_oomd", "pass", "no systemd in this container: no systemd-oomd"))
    else:
        out.append(_oomd_check(facts))
    if box is not None and not box.systemd_pid1 and caps is None:
        out.append(_check("linger", "pass", "no systemd in this container: nothing lingers"))
    elif facts.linger is None:
        out.append(_check("linger", "pass", "not needed for the system manager"))
    elif facts.linger:
        out.append(
            _check("linger", "pass", f"{facts.user} lingers: the user manager outlives logins")
        )
    else:
        out.append(
            _check(
                "linger",
                "warn",
                f"{facts.user} does not linger: agents die with the last login session",
                f"sudo loginctl enable-linger {facts.user}",
            )
        )
    adj = facts.oom_score_adj
    if adj is None:
        out.append(_check("oom_score_adj", "warn", "cannot read this process's oom_score_adj"))
    elif adj >= 800:
        out.append(
            _check(
                "oom_score_adj",
                "warn",
                f"this process has oom_score_adj {adj}, an agent's score: "
                "is it inside an agent scope?",
                "run the manager outside agent scopes",
            )
        )
    else:
        out.append(_check("oom_score_adj", "pass", f"this process has oom_score_adj {adj}"))
    out.append(_victims_check(facts))
    if facts.launch_gate is not None:
        out.append(_gate_check(facts.launch_gate))
    if facts.mode is not None:  # next to the systemd check, which it explains
        out.insert(1, _check("manager_mode", "pass", f"{facts.mode}: {facts.mode_reason}"))
    return out
