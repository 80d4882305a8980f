"""The guard as a small process of its own: ``python -m agentscope_systemd._guard._guardproc``.

A guard thread shares its process with the harness: when the harness's
main thread holds the GIL while it faults its pages back in (a squeeze
does exactly that), the thread waits for it. A process of its own runs
:func:`agentscope_systemd._guard._guard.run_guard` with nothing else in it: it waits on
nobody's GIL, its few pages can be locked where the harness's are too many
(``RLIMIT_MEMLOCK``), and as root it sets its own ``oom_score_adj`` to
-1000 (it runs nothing else). ``GuardConfig(process=True)`` makes a
:class:`~agentscope_systemd._monitor._monitor.Monitor` start one (:class:`GuardChild`).

The protocol, one JSON object per line. The parent writes nothing; when
the child's stdin reaches EOF (the parent closed it, or died) the child
exits. The child writes ``{"kill": GuardKill.to_dict()}`` for each kill
(and ``{"relayed": ...}`` for another guard's, while it stands by),
``{"held": GuardHeld.to_dict()}`` when it holds its hand (the shortage is
not the fleet's), ``{"trigger": "memory"|"psi"|"thrash"|null, "reading":
HostReading.to_dict()}`` whenever the trigger changes (for admission
control), and ``{"notes": [...]}`` once it is ready.

Nothing a squeeze stalls stands between the child's decision and its kill
(issue #25): its stdout is non-blocking, and a line the parent is not
reading fast enough waits in a short queue, retried at every reading and
dropped (counted) past :data:`PENDING_MAX`, so a parent that stops reading
never stops the guard. It is started with ``python -I -c``: no ``PYTHON*``
variables and no working directory on ``sys.path`` (``python -m`` puts the
working directory first: a ``json.py`` there would run in the guard, maybe
as root); the parent hands it its own absolute ``sys.path`` entries.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._kernel._cgroup import CGROUP_ROOT
from .._kernel._proc import PROC_ROOT
from . import _guardlock
from ._guard import prepare_process, run_guard
from ._guardbase import GuardBase
from ._guardpolicy import GuardConfig, GuardHeld, GuardKill, HostReading, Trigger

__all__ = ["GuardChild", "main"]

log = logging.getLogger("agentscope.guard")

#: How long the child may take to start (Python's start-up under load, or a
#: TCG guest: ~2 s there) before the parent goes on without its notes.
READY_TIMEOUT = 30.0
#: A line longer than this from the child is not one of ours.
MAX_LINE = 64 * 1024
#: Lines the child keeps for a parent that does not read; older ones are dropped.
PENDING_MAX = 64
#: What the child runs: its sys.path is given, the package's directory first.
BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv.pop(1)); "
    "from agentscope_systemd._guard._guardproc import main; sys.exit(main())"
)


def _config_json(config: GuardConfig) -> str:
    return json.dumps(config.to_dict())


class _Out:
    """Lines to stdout, never blocking: each in one write (<= PIPE_BUF stays whole)."""

    def __init__(self, fd: int = 1) -> None:
        self.fd = fd
        self.pending: list[bytes] = []
        self.dropped = 0
        os.set_blocking(fd, False)

    def write(self, obj: dict[str, Any]) -> None:
        """Queue one line and send what the pipe takes now."""
        self.pending.append((json.dumps(obj, separators=(",", ":")) + "\n").encode())
        if len(self.pending) > PENDING_MAX:
            del self.pending[0]
            self.dropped += 1
        self.flush()

    def flush(self) -> None:
        """Send the queued lines the pipe takes; keep the rest for later."""
        while self.pending:
            try:
                os.write(self.fd, self.pending[0])
            except BlockingIOError:
                return
            except BrokenPipeError:
                self.pending.clear()
                return
            del self.pending[0]


def main(argv: Sequence[str] | None = None) -> int:
    """The child: guard ``--slice`` until stdin closes."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m agentscope_systemd._guard._guardproc")
    parser.add_argument("--slice", required=True, type=Path)
    parser.add_argument("--config", required=True, help="GuardConfig fields as JSON")
    parser.add_argument("--protect-pid", type=int, action="append", default=[])
    parser.add_argument("--protect-unit", action="append", default=[])
    parser.add_argument("--proc-root", type=Path, default=PROC_ROOT)
    parser.add_argument("--cgroup-root", type=Path, default=CGROUP_ROOT)
    parser.add_argument("--lock-dir", default="", help="the guard lock's directory ('': none)")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, format="agentscope-guard: %(message)s")
    config = GuardConfig(**json.loads(args.config))
    if config.oom_score_adj is None and os.geteuid() == 0:
        # A process that runs nothing but the guard: the kernel never picks it.
        config = replace(config, oom_score_adj=-1000)
    notes = prepare_process(config, args.proc_root)
    pids = frozenset({*args.protect_pid, os.getppid()})
    units = frozenset(args.protect_unit)
    last: list[Trigger | None] = [None]
    out = _Out()

    def on_reading(reading: HostReading, trigger: Trigger | None) -> None:
        out.flush()
        if trigger != last[0]:
            last[0] = trigger
            out.write({"trigger": trigger, "reading": reading.to_dict()})

    out.write({"notes": notes})
    run_guard(
        config,
        args.slice,
        stop_fd=0,
        on_kill=lambda kill: out.write({"kill": kill.to_dict()}),
        on_held=lambda held: out.write({"held": held.to_dict()}),
        # Another guard's kills: the parent knows whose agents they are.
        on_relay=lambda kill: out.write({"relayed": kill.to_dict()}),
        protected=lambda: (pids, units),
        on_reading=on_reading,
        proc_root=args.proc_root,
        cgroup_root=args.cgroup_root,
        lock_dir=Path(args.lock_dir) if args.lock_dir else None,
    )
    if out.dropped:
        log.warning("%d lines to the parent were dropped: it did not read them", out.dropped)
    return 0


def _kill_of(data: dict[str, Any], unit_agent: Callable[[str], str | None]) -> GuardKill:
    fields = {k: v for k, v in data.items() if k != "kind"}
    fields["agent"] = unit_agent(str(fields["unit"]))
    return GuardKill(**fields)


def _reading_of(data: dict[str, Any]) -> HostReading:
    names = HostReading.__dataclass_fields__
    return HostReading(**{k: v for k, v in data.items() if k in names})


class GuardChild(GuardBase):
    """The guard in a child process; the same face as :class:`._guardthread.Guard`.

    :meth:`start` spawns ``python -m agentscope_systemd._guard._guardproc`` and a thread
    reading its lines; :meth:`stop` closes its stdin and waits. The
    protected pids and units are fixed at the start (the parent's pid is
    always protected).
    """

    # Set by start(): the child, its line reader, and "the child said it guards".
    _proc: subprocess.Popen[bytes] | None = None
    _reader: threading.Thread | None = None
    _ready: threading.Event

    @property
    def pid(self) -> int | None:
        """The child's pid (None before start)."""
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        """The child runs."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Spawn the child and wait until it is guarding (or READY_TIMEOUT passed)."""
        if self._proc is not None:
            raise RuntimeError("this GuardChild was started before")
        self._ready = threading.Event()
        pids, units = self.protected()
        lock_dir = _guardlock.default_lock_dir()
        # The directory holding the package first, then the parent's absolute
        # entries; never "" or a relative one (the working directory).
        package_root = str(Path(__file__).resolve().parents[2])
        paths = [package_root, *(p for p in sys.path if os.path.isabs(p) and p != package_root)]
        argv = [
            sys.executable,
            "-I",
            "-c",
            BOOT,
            json.dumps(paths),
            "--slice",
            os.fspath(self.slice_path),
            "--config",
            _config_json(self.config),
            "--proc-root",
            os.fspath(self.proc_root),
            "--cgroup-root",
            os.fspath(self.cgroup_root),
            "--lock-dir",
            os.fspath(lock_dir) if lock_dir is not None else "",
        ]
        for pid in sorted(pids):
            argv += ["--protect-pid", str(pid)]
        for unit in sorted(units):
            argv += ["--protect-unit", unit]
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True, cwd="/"
        )
        self._reader = threading.Thread(
            target=self._read, name="agentscope-guard-reader", daemon=True
        )
        self._reader.start()
        if not self._ready.wait(READY_TIMEOUT):
            log.warning("the guard process did not report ready in %.0f s", READY_TIMEOUT)

    def stop(self, timeout: float = 5.0) -> None:
        """Close the child's stdin (it exits) and wait for it and the reader."""
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None and not proc.stdin.closed:
            proc.stdin.close()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if self._reader is not None:
            self._reader.join(timeout)

    def _read(self) -> None:
        proc = self._proc
        assert proc is not None
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                self._line(raw)
        finally:
            self._ready.set()
            proc.stdout.close()

    def _line(self, raw: bytes) -> None:
        if len(raw) > MAX_LINE:
            return
        try:
            msg = json.loads(raw)
            if "kill" in msg:
                self._killed(_kill_of(msg["kill"], self.unit_agent))
            elif "relayed" in msg:
                kill = _kill_of(msg["relayed"], self.unit_agent)
                if kill.agent is not None:  # another guard's kill of one of ours
                    self.on_kill(kill)
            elif "held" in msg:
                if self.on_held is not None:
                    self.on_held(GuardHeld(**{k: v for k, v in msg["held"].items() if k != "kind"}))
            elif "trigger" in msg:
                self._seen(_reading_of(msg["reading"]), msg["trigger"])
            elif "notes" in msg:
                self.notes = [str(n) for n in msg["notes"]]
                self._ready.set()
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("unexpected line from the guard process: %r (%s)", raw[:200], exc)


if __name__ == "__main__":
    sys.exit(main())
