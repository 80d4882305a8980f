"""Where PID 1 is not systemd: is this a container, and what does its cgroup allow?

Hosted coding agents, CI runners, devcontainers and Kubernetes pods run a
harness and its agents in one container, where no systemd manager runs
(issue #27). agentscope's fleets need one today, and the error they give
there must say so plainly instead of repeating a bus address. These readers
tell the fleet's error and ``agentscope doctor`` what they need:

- :func:`pid1_comm`: ``/proc/1/comm`` (``systemd`` on a systemd host);
- :func:`inspect_container`: the container's kind and what says so
  (``/.dockerenv``, Podman's ``/run/.containerenv``, ``container=`` in the
  environment (systemd's Container Interface), ``KUBERNETES_SERVICE_HOST``,
  WSL's kernel), cgroup v2, whether this process's own cgroup subtree is
  writable (read-only is the Docker and Kubernetes default), and the memory
  limit over it with its ``memory.oom.group``;
- :func:`not_systemd_note`: the sentence :class:`~agentscope_systemd.SystemdUnavailable`
  puts first where PID 1 is not systemd.

Every read tolerates a missing or unreadable file: it then tells nothing.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .._dicts import Record
from ._cgroup import (
    _GONE_OR_DENIED,
    CGROUP_ROOT,
    _read_kernel_file,
    cgroup_chain,
    cgroup_v2_mounted,
    read_ceiling,
)
from ._proc import PROC_ROOT

__all__ = ["ContainerView", "inspect_container", "not_systemd_note", "pid1_comm"]

#: The file system root whose marker files are looked at (tests point it at a tree).
FS_ROOT = Path("/")
#: At most this much of a file is read (a comm is 16 bytes, an environ a few KiB).
_MAX_READ = 64 * 1024


def _read(path: Path) -> bytes | None:
    try:
        data = _read_kernel_file(path, _GONE_OR_DENIED | {errno.EISDIR})
    except OSError:
        return None
    return None if data is None else data[:_MAX_READ]


def pid1_comm(proc_root: Path | None = None) -> str | None:
    """The name of PID 1 (``/proc/1/comm``), printable only; None when it cannot be read."""
    data = _read((proc_root or PROC_ROOT) / "1" / "comm")
    if data is None:
        return None
    name = data.strip().decode("utf-8", "replace")
    return "".join(c if c.isprintable() else "?" for c in name)[:64] or None


@dataclass(frozen=True, slots=True)
class ContainerView(Record):
    """What this process runs in, as far as files tell.

    ``pid1`` is PID 1's name; ``kind`` the container's kind (``docker``,
    ``podman``, ``kubernetes``, ``lxc``, ``systemd-nspawn``, ``wsl``, or
    ``container`` when only the environment's ``container=`` says so; None:
    none found) and ``evidence`` what said so. ``own_cgroup`` is this
    process's cgroup v2 path (``/`` inside a cgroup namespace: the
    container's own cgroup), ``writable`` whether that cgroup can be written
    (None without cgroup v2), ``limit``/``limit_path`` the nearest memory
    limit over it (bytes, and the cgroup) and ``oom_group`` its
    ``memory.oom.group`` (True: one OOM kills everything in it).
    """

    pid1: str | None
    kind: str | None
    evidence: tuple[str, ...]
    cgroup_v2: bool
    own_cgroup: str | None
    writable: bool | None
    limit: int | None
    limit_path: str | None
    oom_group: bool | None

    @property
    def systemd_pid1(self) -> bool:
        """PID 1 is systemd (its name; None, unreadable, counts as systemd: nothing to say)."""
        return self.pid1 is None or self.pid1 == "systemd"

    def describe(self) -> str:
        """One clause: what this looks like and why, e.g. ``a container (docker: /.dockerenv)``."""
        return _looks_like(self.kind, self.evidence)


def _looks_like(kind: str | None, evidence: tuple[str, ...]) -> str:
    why = ", ".join(evidence)
    if kind == "wsl":
        return f"WSL without systemd ({why})"
    if kind is not None:
        return f"a container ({kind}: {why})"
    return "a container, or a host booted without systemd"


def _environ(data: bytes | None) -> dict[str, str]:
    found: dict[str, str] = {}
    for item in (data or b"").split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in (b"container", b"KUBERNETES_SERVICE_HOST"):
            found[key.decode()] = value.decode("utf-8", "replace")[:64]
    return found


def _kind(
    proc_root: Path, root: Path, env: Mapping[str, str]
) -> tuple[str | None, tuple[str, ...]]:
    evidence: list[str] = []
    kind = None
    pid1_env = _environ(_read(proc_root / "1" / "environ"))
    label = env.get("container") or pid1_env.get("container")
    if "KUBERNETES_SERVICE_HOST" in env or "KUBERNETES_SERVICE_HOST" in pid1_env:
        kind = "kubernetes"
        evidence.append("KUBERNETES_SERVICE_HOST")
    if (root / ".dockerenv").exists():
        kind = kind or "docker"
        evidence.append("/.dockerenv")
    if (root / "run" / ".containerenv").exists():
        kind = kind or "podman"
        evidence.append("/run/.containerenv")
    if label:
        clean = "".join(c for c in label if c.isalnum() or c in "-_.")[:32] or "container"
        kind = kind or (clean if clean in ("docker", "podman", "lxc", "systemd-nspawn") else None)
        kind = kind or "container"
        evidence.append(f"container={clean}")
    if kind is None:
        release = _read(proc_root / "sys" / "kernel" / "osrelease") or b""
        if b"microsoft" in release.lower():
            kind = "wsl"
            evidence.append("a Microsoft kernel")
    return kind, tuple(evidence)


def inspect_container(
    proc_root: Path | None = None,
    cgroup_root: Path = CGROUP_ROOT,
    root: Path | None = None,
    env: Mapping[str, str] | None = None,
    pid: int | None = None,
) -> ContainerView:
    """Look at PID 1, the container's markers and this process's cgroup (``pid``: another's)."""
    proc = proc_root or PROC_ROOT
    fs = root or FS_ROOT
    kind, evidence = _kind(proc, fs, os.environ if env is None else env)
    v2 = cgroup_v2_mounted(cgroup_root)
    own = writable = limit = limit_path = oom_group = None
    if v2:
        data = _read(proc / str(os.getpid() if pid is None else pid) / "cgroup") or b""
        for line in data.splitlines():
            if line.startswith(b"0::"):
                own = os.fsdecode(line[3:].removesuffix(b" (deleted)"))[:4096]
    if own is not None:
        chain = cgroup_chain(cgroup_root, own)
        writable = os.access(chain[0], os.W_OK) and os.access(chain[0] + "/cgroup.procs", os.W_OK)
        for path in chain:
            ceiling = read_ceiling(path)
            if ceiling is not None and ceiling.limit is not None:
                limit = ceiling.limit
                base = os.fspath(cgroup_root).rstrip("/")
                limit_path = path[len(base) :] or "/"
                group = _read(Path(path) / "memory.oom.group")
                oom_group = None if group is None else group.strip() == b"1"
                break
    return ContainerView(
        pid1_comm(proc), kind, evidence, v2, own, writable, limit, limit_path, oom_group
    )


def not_systemd_note(proc_root: Path | None = None) -> str | None:
    """Where PID 1 is not systemd: the sentence saying so, what this looks like, what to do.

    None where PID 1 is systemd (or cannot be read): the bus is then what failed.
    """
    pid1 = pid1_comm(proc_root)
    if pid1 is None or pid1 == "systemd":
        return None
    kind, evidence = _kind(proc_root or PROC_ROOT, FS_ROOT, os.environ)
    if kind == "wsl":
        todo = "turn systemd on in WSL ([boot] systemd=true in /etc/wsl.conf, then wsl --shutdown)"
    else:
        todo = "start the container with systemd as PID 1 (podman run --systemd=always)"
    return (
        f"PID 1 is not systemd: this looks like {_looks_like(kind, evidence)}; "
        f"PID 1 is {pid1!r}. "
        "The systemd manager mode needs one: leave --manager at auto (the default) to run "
        "the fleet without it (cgroup or process mode, docs/containers.md), "
        f"or {todo}; `agentscope exec` needs systemd: `agentscope exec --fallback run NAME -- CMD` "
        "runs the agent unconfined"
    )
